"""Writing a weights-only checkpoint: model tensors from elsewhere (Hugging Face, torchtitan) as a
truestep checkpoint that verifies like any other and that a fresh run starts from (`init_from`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from truestep.checkpoint.catalog import step_dir_name, step_of
from truestep.checkpoint.integrity import verify
from truestep.checkpoint.manifest import write_manifest, write_marker
from truestep.checkpoint.safe_dcp import single_process
from truestep.checkpoint.weights import WEIGHTS_INFO_FILE, weights_info
from truestep.config.schema import ModelConfig
from truestep.core.fsio import atomic_write, new_staging_dir, publish_dir


def write_weights_checkpoint(
    out: Path,
    tensors: dict[str, torch.Tensor],
    cfg: ModelConfig,
    source: dict[str, Any],
    step: int = 0,
    extra_files: dict[str, bytes] | None = None,
    extra_info: dict[str, Any] | None = None,
) -> Path:
    """Write a weights-only truestep checkpoint (DCP + interop.json + manifest + COMMITTED).

    `out` is the `step_XXXXXXXX` directory itself, or a checkpoint root under which
    `step_XXXXXXXX` (for `step`) is created. `extra_files` (bare name -> bytes, e.g. a tokenizer) are
    written beside the weights and covered by the manifest; `extra_info` is merged into interop.json.
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
            writer = FileSystemWriter(staging, sync_files=True)
            dcp.save({"model": tensors}, storage_writer=writer, no_dist=True)
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
