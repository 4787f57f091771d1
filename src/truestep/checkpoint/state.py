"""The full list of state that shapes the trajectory, captured and restored in one place.

- weights and optimizer state: DCP, through get_/set_{model,optimizer}_state_dict (resharding-capable);
- per-rank JSON (`rankNNNNN.json`): counters and accounting, data position, every RNG stream of this
  rank, the trajectory config keys and the layout. Per-rank files because DCP keeps only one rank's copy
  of a non-DTensor value stored under a shared key.
Adding a piece of state is one edit here.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from truestep.checkpoint.fsio import atomic_write
from truestep.checkpoint.layout import rank_state_name
from truestep.checkpoint.manifest import read_json
from truestep.checkpoint.resolver import ResumeError
from truestep.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner
from truestep.config.fingerprint import diff_keys, fingerprint, trajectory_keys
from truestep.train.rng import capture_rng, restore_rng, seed_streams

if TYPE_CHECKING:
    from truestep.train.trainer import Trainer

RANK_STATE_FORMAT = "truestep-rank-state"


def dcp_state(trainer: Trainer, with_optimizer: bool = True) -> dict[str, Any]:
    state: dict[str, Any] = {"model": get_model_state_dict(trainer.model)}
    if with_optimizer:
        state["optim"] = get_optimizer_state_dict(trainer.model, trainer.optimizer)
    return state


def rank_state(trainer: Trainer) -> dict[str, Any]:
    keys = trajectory_keys(trainer.cfg)
    return {
        "format": RANK_STATE_FORMAT,
        "version": 1,
        "rank": trainer.ctx.rank,
        "dp_rank": trainer.ctx.dp_rank,
        "tp_rank": trainer.ctx.tp_rank,
        "layout": trainer.ctx.layout(),
        "train_state": asdict(trainer.state),
        "loader": trainer.loader.state_dict(),
        "rng": capture_rng(),
        "config_keys": keys,
        "config_fingerprint": fingerprint(keys),
        "saved_at": time.time(),
    }


def write_rank_state(trainer: Trainer, ckpt_dir: Path) -> None:
    blob = json.dumps(rank_state(trainer), separators=(",", ":")).encode()
    atomic_write(ckpt_dir / rank_state_name(trainer.ctx.rank), blob)


def _read_rank_state(ckpt_dir: Path, rank: int) -> dict[str, Any]:
    saved = read_json(ckpt_dir / rank_state_name(rank))
    if not isinstance(saved, dict) or saved.get("format") != RANK_STATE_FORMAT or saved.get("version") != 1:
        raise ResumeError(f"{ckpt_dir / rank_state_name(rank)} is not a truestep rank-state file (v1)")
    return saved


def check_config(trainer: Trainer, saved: dict[str, Any]) -> list[str]:
    """Differences in trajectory-relevant keys; raises unless checkpoint.allow_config_change."""
    differences = diff_keys(saved["config_keys"], trajectory_keys(trainer.cfg))
    if differences and not trainer.cfg.checkpoint.allow_config_change:
        raise ResumeError(
            "refusing to resume: the config differs from the checkpoint's in keys that change the "
            "trajectory:\n  " + "\n  ".join(differences) + "\nRestore them, start a new run directory, or "
            "pass --checkpoint.allow_config_change=true to resume anyway."
        )
    return differences


def restore(trainer: Trainer, ckpt_dir: Path) -> dict[str, Any]:
    """Collective. Restore everything the switches allow; return facts for the restore event."""
    cfg, ctx = trainer.cfg.checkpoint, trainer.ctx
    shared = _read_rank_state(ckpt_dir, 0)
    differences = check_config(trainer, shared)
    same_layout = shared["layout"] == ctx.layout()

    state = dcp_state(trainer, with_optimizer=cfg.restore_optimizer_state)
    weights_restored = True
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(ckpt_dir), planner=SafeLoadPlanner())
    except (Exception, CheckpointException) as err:  # DCP's CheckpointException is a BaseException
        if cfg.atomic_commit:
            raise
        # Ablation of atomic_commit: reproduce the naive trainer that trusts a torn directory, loads
        # what is there and carries on (strict=False style). Loud in the event log, silent in training.
        weights_restored = False
        trainer.logs.event("naive_partial_restore", path=str(ckpt_dir), error=f"{type(err).__name__}: {err}")
    if weights_restored:
        set_model_state_dict(trainer.model, state["model"])
        if cfg.restore_optimizer_state:
            set_optimizer_state_dict(trainer.model, trainer.optimizer, state["optim"])

    for key, value in shared["train_state"].items():
        setattr(trainer.state, key, value)
    trainer.state.attempts += 1
    if cfg.restore_data_position:
        trainer.loader.load_state_dict(shared["loader"])

    step, seed = trainer.state.step, trainer.cfg.train.seed
    if not cfg.restore_rng_state:
        rng_policy = "fresh-seed"
        seed_streams(seed, ctx.dp_rank, step=0)
    elif same_layout:
        rng_policy = "restored"
        restore_rng(_read_rank_state(ckpt_dir, ctx.rank)["rng"])
    else:
        rng_policy = "rederived"
        seed_streams(seed, ctx.dp_rank, step=step)
    return {
        "step": step,
        "layout_changed": not same_layout,
        "saved_layout": shared["layout"],
        "rng_policy": rng_policy,
        "config_differences": differences,
        "restored_weights": weights_restored,
        "restored_optimizer": cfg.restore_optimizer_state and weights_restored,
        "restored_data_position": cfg.restore_data_position,
    }
