"""`checkpoint.init_from`: start a fresh run from the weights of a checkpoint (truestep or imported)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor

from truestep.checkpoint.layout import step_of
from truestep.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner, UnsafeCheckpointError
from truestep.config.load import ConfigError
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

# Keys that change the function the weights compute (or how far it reaches) without changing any shape.
_NUMERIC_KEYS = ("norm_eps", "rope_theta", "tie_embeddings", "max_seq_len", "rope_scaling")
# The llama3 scaling parameters, compared only when either side uses llama3 scaling.
_SCALING_KEYS = (
    "rope_scaling_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_seq_len",
)


def load_init_weights(model: nn.Module, ckpt_dir: str | Path, checksums: bool = True) -> dict[str, Any]:
    """Copy the model weights of a verified checkpoint into `model`, in place.

    `ckpt_dir` is a `step_XXXXXXXX` directory (it must verify) or a checkpoint root / run directory
    (the newest step that verifies is used). Only model weights are read: optimizer state, RNG, data
    position and step counters are not (this is initialization, not resume).

    Two ways to call it:
    - on the plain, un-sharded model before `parallelize`: each rank reads the full weights on its own,
      without collectives (every rank may call it, or only some);
    - on a parallelized model (FSDP2/TP DTensor parameters): then it is **collective**, every rank must
      call it, and each reads only its shards (as resume does).

    Every parameter must be present with the configured (global) shape: a mismatch raises InteropError
    naming each key. Differences in shape-preserving keys (rope_theta, norm_eps, ...) between the
    checkpoint's recorded model config and `model.cfg` do not raise; they are returned in
    `config_differences` for the caller to log.

    Returns facts for an event: path, step, tensors, sharded, config_differences, checksums.
    """
    plain = model.state_dict()
    sharded = any(isinstance(v, DTensor) for v in plain.values())
    path = verified_checkpoint(Path(ckpt_dir), checksums)
    meta = model_tensor_meta(path)
    saved_cfg = read_model_config(path)
    problems = shape_problems(meta, {k: tuple(v.shape) for k, v in plain.items()})
    cfg = getattr(model, "cfg", None)
    differences = _config_differences(saved_cfg, cfg) if isinstance(cfg, ModelConfig) else []
    if isinstance(cfg, ModelConfig) and saved_cfg.tie_embeddings != cfg.tie_embeddings:
        problems.append(
            f"model.tie_embeddings: checkpoint {saved_cfg.tie_embeddings}, configured {cfg.tie_embeddings}"
        )
    if problems:
        more = f"; ... ({len(problems) - 8} more)" if len(problems) > 8 else ""
        raise InteropError(
            f"checkpoint.init_from={path} does not fit the configured model: "
            + "; ".join(problems[:8])
            + more
            + ". The checkpoint's model config is: "
            + " ".join(model_overrides(saved_cfg))
        )
    if sharded:
        state = get_model_state_dict(model)
        try:
            dcp.load({"model": state}, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner())
        except UnsafeCheckpointError as err:
            raise InteropError(f"{path}: {err}") from err
        set_model_state_dict(model, state)
    else:
        load_model_tensors(path, into=plain)
    return {
        "path": str(path),
        "step": step_of(path),
        "tensors": len(plain),
        "sharded": sharded,
        "config_differences": differences,
        "checksums": checksums,
    }


def _config_differences(saved: ModelConfig, current: ModelConfig) -> list[str]:
    scaled = "llama3" in (saved.rope_scaling, current.rope_scaling)
    keys = _NUMERIC_KEYS + (_SCALING_KEYS if scaled else ())
    out = []
    for field in dataclasses.fields(ModelConfig):
        old, new = getattr(saved, field.name), getattr(current, field.name)
        if field.name in keys and old != new:
            out.append(f"model.{field.name}: {old!r} (checkpoint) -> {new!r} (configured)")
    return out


def init_from_checkpoint(model: nn.Module, ckpt_dir: str, checksums: bool, is_main: bool) -> dict[str, Any]:
    """The trainer's `checkpoint.init_from`: `load_init_weights`, with a refusal as a one-line ConfigError
    (exit 2 from the CLI, no traceback), and a console warning on rank 0 when the configured model computes
    with other RoPE/norm settings than the checkpoint was trained with (a wrong RoPE base trains fine and
    silently worse)."""
    try:
        facts = load_init_weights(model, ckpt_dir, checksums)
    except InteropError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        message = "; ".join(lines)
        prefix = "" if message.startswith("checkpoint.init_from") else f"checkpoint.init_from={ckpt_dir}: "
        raise ConfigError(prefix + message) from err
    if facts["config_differences"] and is_main:
        print(
            f"truestep train: warning: checkpoint.init_from={facts['path']}: the configured model differs from "
            "the one the weights were trained with: " + "; ".join(facts["config_differences"]),
            file=sys.stderr,
            flush=True,
        )
    return facts
