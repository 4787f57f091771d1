"""`checkpoint.init_from`: start a fresh run from the weights of a checkpoint (truestep or imported).

Which checkpoint is decided on rank 0 and broadcast (`resolver.find_verified_collective`): every rank
loads the same directory or every rank refuses, never a mix that would hang the collective load.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor

from truestep.checkpoint.catalog import step_of
from truestep.checkpoint.errors import CheckpointContentError, TensorMismatchError
from truestep.checkpoint.resolver import CheckpointNotFound, find_verified, find_verified_collective
from truestep.checkpoint.safe_dcp import load_dcp
from truestep.checkpoint.weights import (
    TIED_EMBEDDING,
    TIED_OUTPUT,
    TensorMeta,
    WeightsError,
    expected_shapes,
    layer_count_problem,
    load_model_tensors,
    model_overrides,
    model_tensor_meta,
    problem_list,
    read_model_config,
    shape_problems,
    with_tied_output,
)
from truestep.config.schema import ModelConfig
from truestep.parallel.dist import DistContext

# Keys that change the function the weights compute (or how far it reaches) without changing any shape.
NUMERIC_KEYS = ("norm_eps", "rope_theta", "tie_embeddings", "max_seq_len", "rope_scaling")
# The llama3 scaling parameters, compared only when either side uses llama3 scaling.
SCALING_KEYS = (
    "rope_scaling_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_seq_len",
)


def load_init_weights(
    model: nn.Module, ckpt_dir: str | Path, checksums: bool = True, ctx: DistContext | None = None
) -> dict[str, Any]:
    """Copy the model weights of a verified checkpoint into `model`, in place.

    `ckpt_dir` is a `step_XXXXXXXX` directory (it must verify) or a checkpoint root / run directory
    (the newest step that verifies is used). Only model weights are read: optimizer state, RNG, data
    position and step counters are not (this is initialization, not resume).

    Two ways to call it:
    - on the plain, un-sharded model before `parallelize` (ctx None): reads the full weights alone,
      without collectives;
    - on a parallelized model with its `ctx`: **collective**, every rank must call it; rank 0 picks the
      checkpoint, each rank reads only its shards (as resume does).

    Every parameter must be present with the configured (global) shape: a mismatch raises WeightsError
    naming each key. Differences in shape-preserving keys (rope_theta, norm_eps, ...) between the
    checkpoint's recorded model config and `model.cfg` do not raise; they are returned in
    `config_differences` for the caller to report.

    Returns facts for an event: path, step, tensors, sharded, config_differences, checksums.
    """
    plain = model.state_dict()
    sharded = any(isinstance(v, DTensor) for v in plain.values())
    try:
        if ctx is not None:
            path = find_verified_collective(Path(ckpt_dir), checksums, ctx)
        else:
            path = find_verified(Path(ckpt_dir), checksums)
    except CheckpointNotFound as err:
        raise CheckpointNotFound(f"checkpoint.init_from={ckpt_dir}: {err}") from None
    meta = model_tensor_meta(path)
    saved_cfg = read_model_config(path)
    cfg = getattr(model, "cfg", None)
    _refuse_unfit(path, meta, saved_cfg, {k: tuple(v.shape) for k, v in plain.items()}, cfg)
    differences = config_differences(saved_cfg, cfg) if isinstance(cfg, ModelConfig) else []
    if sharded:
        state = get_model_state_dict(model)
        # A tied output weight stored once (as the embedding, by import-hf) is loaded through the embedding.
        once = saved_cfg.tie_embeddings and TIED_OUTPUT not in meta and TIED_OUTPUT in state
        targets = {k: v for k, v in state.items() if not (once and k == TIED_OUTPUT)}
        try:
            load_dcp({"model": targets}, path)
        except (CheckpointContentError, TensorMismatchError) as err:
            raise WeightsError(f"checkpoint.init_from={path}: {err}") from err
        if once:
            state[TIED_OUTPUT] = state[TIED_EMBEDDING]
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


def precheck_init_from(ckpt_dir: str | Path, cfg: ModelConfig) -> Path:
    """Refuse an `init_from` checkpoint that cannot fit `cfg` *before* the model is built.

    Reads only the checkpoint's DCP metadata and recorded config (sizes verified, not checksums: the
    collective load verifies them later) and compares shapes computed on the meta device
    (`expected_shapes`, one layer built whatever `n_layers` says), so a mismatch against an 8B or 70B
    preset is a one-line refusal naming the differing keys, not 32-280 GB allocated first.
    Rank-local and read-only; every rank reaches the same answer from the same files.
    Returns the step directory it checked.
    """
    try:
        path = find_verified(Path(ckpt_dir), checksums=False)
    except CheckpointNotFound as err:
        raise CheckpointNotFound(f"checkpoint.init_from={ckpt_dir}: {err}") from None
    meta = model_tensor_meta(path)
    saved_cfg = read_model_config(path)
    layers = layer_count_problem(meta, cfg.n_layers, "checkpoint", "the configured model has")
    if layers:  # before expected_shapes: a wrong layer count is named without listing every key
        _refuse(path, [layers], saved_cfg)
    try:
        expected = expected_shapes(cfg)
    except WeightsError as err:
        raise WeightsError(f"checkpoint.init_from={path}: {err}") from None
    _refuse_unfit(path, meta, saved_cfg, expected, cfg)
    return path


def _refuse_unfit(
    path: Path,
    meta: dict[str, TensorMeta],
    saved_cfg: ModelConfig,
    expected: dict[str, tuple[int, ...]],
    cfg: object,
) -> None:
    problems = shape_problems(with_tied_output(meta, saved_cfg.tie_embeddings), expected)
    if isinstance(cfg, ModelConfig) and saved_cfg.tie_embeddings != cfg.tie_embeddings:
        problems.append(
            f"model.tie_embeddings: checkpoint {saved_cfg.tie_embeddings}, configured {cfg.tie_embeddings}"
        )
    if problems:
        _refuse(path, problems, saved_cfg)


def _refuse(path: Path, problems: list[str], saved_cfg: ModelConfig) -> None:
    raise WeightsError(
        f"checkpoint.init_from={path} does not fit the configured model: "
        + problem_list(problems)
        + ". The checkpoint's model config is: "
        + " ".join(model_overrides(saved_cfg))
    )


def config_differences(saved: ModelConfig, current: ModelConfig) -> list[str]:
    scaled = "llama3" in (saved.rope_scaling, current.rope_scaling)
    keys = NUMERIC_KEYS + (SCALING_KEYS if scaled else ())
    out = []
    for field in dataclasses.fields(ModelConfig):
        old, new = getattr(saved, field.name), getattr(current, field.name)
        if field.name in keys and old != new:
            out.append(f"model.{field.name}: {old!r} (checkpoint) -> {new!r} (configured)")
    return out
