"""Model weights of a checkpoint without a process group: what tensors it holds, reading them into
full tensors, and the model config they were saved with.

Weights are read through `safe_dcp` (no arbitrary unpickling) with `no_dist=True`, into plain full
tensors allocated from the DCP metadata: DCP reassembles whatever layout (FSDP shards, TP shards, one
process) the checkpoint was saved with. Used by export, `init_from`, generation and inspection.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from truestep.checkpoint.manifest import VerifyError, read_json
from truestep.checkpoint.safe_dcp import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeCheckpointError,
    single_process,
)
from truestep.checkpoint.state import read_rank_state
from truestep.config.schema import ModelConfig
from truestep.core.errors import RefusedError
from truestep.model.llama import Transformer

WEIGHTS_INFO_FILE = "interop.json"
"""Written in place of the rank-state files by a weights-only checkpoint (`truestep import-hf`): where
the weights came from and the model config they fit (flat `model.*` keys, as in `config_keys`)."""
WEIGHTS_INFO_FORMAT = "truestep-interop"
MODEL_PREFIX = "model."


class WeightsError(RefusedError):
    """The checkpoint's weights cannot be read or do not fit; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def model_config_from_keys(keys: dict[str, Any], where: Path) -> ModelConfig:
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    values = {k[len(MODEL_PREFIX) :]: v for k, v in keys.items() if k.startswith(MODEL_PREFIX)}
    if not values:
        raise WeightsError(f"{where} records no model.* config keys")
    return ModelConfig(**{k: v for k, v in values.items() if k in known})


def read_model_config(ckpt_dir: Path) -> ModelConfig:
    """The model config a checkpoint was saved with: interop.json (imported weights) or rank00000.json."""
    info = ckpt_dir / WEIGHTS_INFO_FILE
    try:
        if info.is_file():
            saved = read_json(info)
            keys = saved.get("config_keys") if isinstance(saved, dict) else None
            if not isinstance(keys, dict):
                raise WeightsError(f"{info} has no config_keys table")
            return model_config_from_keys(keys, info)
        return model_config_from_keys(read_rank_state(ckpt_dir, 0).config_keys, ckpt_dir)
    except VerifyError as err:
        raise WeightsError(f"{ckpt_dir}: model config unknown: {err}") from err


def weights_info(cfg: ModelConfig, source: dict[str, Any]) -> dict[str, Any]:
    """The interop.json of a weights-only checkpoint: where the weights came from, the config they fit."""
    return {
        "format": WEIGHTS_INFO_FORMAT,
        "version": 1,
        "kind": "weights-only",
        "created_at": time.time(),
        "source": source,
        "config_keys": {f"{MODEL_PREFIX}{k}": v for k, v in dataclasses.asdict(cfg).items()},
        "model_overrides": model_overrides(cfg),
    }


def model_overrides(cfg: ModelConfig) -> list[str]:
    """`--model.key=value` overrides that reproduce cfg's shape and numerics on the command line."""
    out = []
    for f in dataclasses.fields(ModelConfig):
        if f.name in ("dropout", "init_std"):  # training-time only: the weights do not depend on them
            continue
        value = getattr(cfg, f.name)
        out.append(f"--model.{f.name}={str(value).lower() if isinstance(value, bool) else value}")
    return out


def model_tensor_meta(ckpt_dir: Path) -> dict[str, TensorMeta]:
    """truestep FQN -> (full shape, dtype) of every model tensor stored in the checkpoint, by name."""
    try:
        metadata = SafeFileSystemReader(ckpt_dir).read_metadata()
    except UnsafeCheckpointError as err:
        raise WeightsError(f"{ckpt_dir}: {err}") from err
    except OSError as err:
        raise WeightsError(f"{ckpt_dir}: cannot read DCP metadata: {err}") from err
    found = {}
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(item, TensorStorageMetadata):
            found[key[len(MODEL_PREFIX) :]] = TensorMeta(tuple(item.size), item.properties.dtype)
    if not found:
        raise WeightsError(f"{ckpt_dir}: the checkpoint holds no model weights")
    return dict(sorted(found.items()))


def load_model_tensors(
    ckpt_dir: Path,
    fqns: list[str] | None = None,
    meta: dict[str, TensorMeta] | None = None,
    into: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Full CPU tensors (stored dtype) for `fqns` (default: every model tensor).

    With `into`, DCP copies straight into those tensors (e.g. a model's own parameters) instead.
    """
    if into is None:
        meta = meta if meta is not None else model_tensor_meta(ckpt_dir)
        wanted = list(meta) if fqns is None else fqns
        into = {fqn: torch.empty(meta[fqn].shape, dtype=meta[fqn].dtype) for fqn in wanted}
    if into:
        try:
            with single_process():
                dcp.load(
                    {"model": into},
                    storage_reader=SafeFileSystemReader(ckpt_dir),
                    planner=SafeLoadPlanner(),
                    no_dist=True,
                )
        except UnsafeCheckpointError as err:
            raise WeightsError(f"{ckpt_dir}: {err}") from err
    return into


def shape_problems(
    meta: dict[str, TensorMeta],
    expected: dict[str, tuple[int, ...]],
    name: Callable[[str], str] = str,
    stored: str = "checkpoint",
    wanted: str = "model expects",
) -> list[str]:
    """Differences between stored tensors and the expected {fqn: shape}, one line per key (named by `name`)."""
    problems = []
    for fqn, shape in expected.items():
        if fqn not in meta:
            problems.append(f"{name(fqn)}: missing from the {stored} ({wanted} {list(shape)})")
        elif meta[fqn].shape != tuple(shape):
            problems.append(f"{name(fqn)}: {stored} has {list(meta[fqn].shape)}, {wanted} {list(shape)}")
    for fqn in meta:
        if fqn not in expected:
            problems.append(f"{name(fqn)}: in the {stored} but not a parameter of the model")
    return problems


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{fqn: shape} of the persistent state of a Transformer(cfg), built on the meta device."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_config_fits(ckpt_dir: Path, cfg: ModelConfig, meta: dict[str, TensorMeta]) -> None:
    problems = shape_problems(meta, expected_shapes(cfg))
    if problems:
        raise WeightsError(
            f"{ckpt_dir}: the stored weights do not match the model config recorded with them: "
            + "; ".join(problems[:20])
        )
