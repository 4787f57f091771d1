"""`checkpoint.init_from`: start a fresh run from the weights of a checkpoint (truestep or imported)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torch import nn
from torch.distributed.tensor import DTensor

from truestep.checkpoint.layout import step_of
from truestep.config.schema import ModelConfig
from truestep.interop.ckpt import (
    load_model_tensors,
    model_overrides,
    model_tensor_meta,
    read_model_config,
    shape_problems,
    verified_checkpoint,
)
from truestep.interop.errors import InteropError

# Keys that change the function the weights compute without changing any shape.
_NUMERIC_KEYS = ("norm_eps", "rope_theta", "tie_embeddings", "max_seq_len")


def load_init_weights(model: nn.Module, ckpt_dir: str | Path, checksums: bool = True) -> dict[str, Any]:
    """Copy the model weights of a verified checkpoint into `model`, in place.

    `ckpt_dir` is a `step_XXXXXXXX` directory (it must verify) or a checkpoint root / run directory
    (the newest step that verifies is used). Only model weights are read: optimizer state, RNG, data
    position and step counters are not (this is initialization, not resume).

    Call it on the plain, un-sharded model before `parallelize` (every rank may call it: it reads
    independently, without collectives). Every parameter must be present with the configured shape:
    a mismatch raises InteropError naming each key. Differences in shape-preserving keys (rope_theta,
    norm_eps, ...) between the checkpoint's recorded model config and `model.cfg` do not raise; they are
    returned in `config_differences` for the caller to log.

    Returns facts for an event: path, step, tensors, config_differences, source.
    """
    state = model.state_dict()
    sharded = [k for k, v in state.items() if isinstance(v, DTensor)]
    if sharded:
        raise InteropError(
            f"load_init_weights needs the plain model before parallelize; {sharded[0]} is already a DTensor"
        )
    path = verified_checkpoint(Path(ckpt_dir), checksums)
    meta = model_tensor_meta(path)
    saved_cfg = read_model_config(path)
    problems = shape_problems(meta, {k: tuple(v.shape) for k, v in state.items()})
    cfg = getattr(model, "cfg", None)
    differences = _config_differences(saved_cfg, cfg) if isinstance(cfg, ModelConfig) else []
    if isinstance(cfg, ModelConfig) and saved_cfg.tie_embeddings != cfg.tie_embeddings:
        problems.append(
            f"model.tie_embeddings: checkpoint {saved_cfg.tie_embeddings}, configured {cfg.tie_embeddings}"
        )
    if problems:
        raise InteropError(
            f"checkpoint.init_from={path} does not fit the configured model:\n  "
            + "\n  ".join(problems[:20])
            + ("\n  ..." if len(problems) > 20 else "")
            + "\nThe checkpoint's model config is: "
            + " ".join(model_overrides(saved_cfg))
        )
    load_model_tensors(path, into=state)
    return {
        "path": str(path),
        "step": step_of(path),
        "tensors": len(state),
        "config_differences": differences,
        "checksums": checksums,
    }


def _config_differences(saved: ModelConfig, current: ModelConfig) -> list[str]:
    out = []
    for field in dataclasses.fields(ModelConfig):
        old, new = getattr(saved, field.name), getattr(current, field.name)
        if field.name in _NUMERIC_KEYS and old != new:
            out.append(f"model.{field.name}: {old!r} (checkpoint) -> {new!r} (configured)")
    return out
