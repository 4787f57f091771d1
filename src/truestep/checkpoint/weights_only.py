"""Writing a weights-only checkpoint: model tensors from elsewhere (Hugging Face, torchtitan) as a
truestep checkpoint that verifies like any other and that a fresh run starts from (`init_from`)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import WriteItem

from truestep.checkpoint.catalog import step_dir_name, step_of
from truestep.checkpoint.integrity import verify
from truestep.checkpoint.manifest import write_manifest, write_marker
from truestep.checkpoint.safe_dcp import dcp_failure, single_process
from truestep.checkpoint.weights import WEIGHTS_INFO_FILE, weights_info
from truestep.config.schema import ModelConfig
from truestep.core.fsio import atomic_write, new_staging_dir, publish_dir


class _StreamingPlanner(DefaultSavePlanner):
    """Plans from meta tensors and produces each tensor's data only when DCP writes it: DCP's CPU writer
    resolves one item at a time and, with one file per tensor (`write_weights_checkpoint`), lets it go once
    written, so at most one tensor of the model is in memory (issue 28)."""

    def __init__(self, produce: Callable[[str], torch.Tensor]) -> None:
        super().__init__()
        self.produce = produce

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor:
        tensor = self.produce(write_item.index.fqn.removeprefix("model."))
        declared = write_item.tensor_data
        if declared is not None and (
            tuple(tensor.shape) != tuple(declared.size) or tensor.dtype != declared.properties.dtype
        ):  # a producer bug: never write bytes the metadata does not describe
            raise ValueError(
                f"{write_item.index.fqn}: produced {tensor.dtype} {list(tensor.shape)}, planned otherwise"
            )
        return tensor


def write_weights_checkpoint(
    out: Path,
    tensors: dict[str, torch.Tensor],
    cfg: ModelConfig,
    source: dict[str, Any],
    step: int = 0,
    extra_files: dict[str, bytes] | None = None,
    extra_info: dict[str, Any] | None = None,
    produce: Callable[[str], torch.Tensor] | None = None,
) -> Path:
    """Write a weights-only truestep checkpoint (DCP + interop.json + manifest + COMMITTED).

    `out` is the `step_XXXXXXXX` directory itself, or a checkpoint root under which
    `step_XXXXXXXX` (for `step`) is created. `extra_files` (bare name -> bytes, e.g. a tokenizer) are
    written beside the weights and covered by the manifest; `extra_info` is merged into interop.json.
    With `produce`, `tensors` are meta-device templates (shape and dtype) and `produce(fqn)` returns each
    tensor's data when it is written, one at a time (streaming import).
    Returns the step directory; it verifies.
    """
    out = Path(out)
    if step_of(out) is not None:
        step_dir, step = out, step_of(out) or 0
    else:
        step_dir = out / step_dir_name(step)
    staging = new_staging_dir(step_dir, "a checkpoint")
    try:
        with single_process():
            # One file per tensor when streaming: DCP's writer keeps every tensor it has written to a
            # file until that file is closed, so one file per rank would hold the whole model.
            writer = FileSystemWriter(staging, sync_files=True, single_file_per_rank=produce is None)
            planner = _StreamingPlanner(produce) if produce is not None else None
            try:
                dcp.save({"model": tensors}, storage_writer=writer, planner=planner, no_dist=True)
            except CheckpointException as err:  # e.g. a producer's refusal, re-raised as itself
                raise dcp_failure(err) from err
        info = {**weights_info(cfg, source), **(extra_info or {})}
        atomic_write(staging / WEIGHTS_INFO_FILE, json.dumps(info, indent=1).encode())
        for name, data in (extra_files or {}).items():
            atomic_write(staging / Path(name).name, data)
        manifest = write_manifest(staging, step)
        write_marker(staging, step, manifest)
        publish_dir(staging, step_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    verify(step_dir, checksums=True)
    return step_dir
