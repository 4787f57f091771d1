"""The rank-state file and the restore: everything beyond DCP that shapes the trajectory, per rank.

What is saved is handed over by the trainer through the `Checkpointable` protocol (the way torchtitan
hands over `Stateful` objects): DCP-able weights and optimizer state, and a JSON-safe `RankState`
(counters, data position, RNG streams). This module owns the `rankNNNNN.json` format around it (layout,
trajectory config keys and fingerprint) and the restore policy: which ablation switches restore what,
and what the RNG streams become on a layout change. Per-rank files because DCP keeps only one rank's
copy of a non-DTensor value stored under a shared key.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch.distributed.checkpoint.api import CheckpointException

from truestep.checkpoint.catalog import is_rank_state_name, rank_state_name
from truestep.checkpoint.errors import ResumeError, TensorMismatchError
from truestep.checkpoint.manifest import VerifyError, read_json
from truestep.checkpoint.safe_dcp import load_dcp
from truestep.config.fingerprint import diff_keys, fingerprint
from truestep.config.schema import CheckpointConfig
from truestep.core.errors import RefusedError
from truestep.core.fsio import atomic_write
from truestep.parallel.dist import DistContext
from truestep.telemetry.run_logs import RunLogs

RANK_STATE_FORMAT = "truestep-rank-state"


class RngPolicy(enum.StrEnum):
    RESTORED = "restored"
    """Same layout: every rank gets its own saved streams back."""
    REDERIVED = "rederived"
    """Layout changed: streams re-derived from (seed, dp_rank, step); the old ones have no counterpart."""
    FRESH_SEED = "fresh-seed"
    """Ablation (restore_rng_state=false): seeded as at a fresh start."""


@dataclass
class RankState:
    """One rank's JSON-safe state beyond DCP."""

    train_state: dict[str, Any]
    """Step and accounting counters (TrainState)."""
    data_position: dict[str, Any]
    """The loader's state (the next global batch)."""
    rng: dict[str, Any]
    """Every RNG stream of the rank."""


class Checkpointable(Protocol):
    """What a checkpoint saves and loads; the trainer implements it."""

    def dcp_state_dict(self, with_optimizer: bool) -> dict[str, Any]: ...

    def load_dcp_state_dict(self, state: dict[str, Any]) -> None: ...

    def rank_state(self) -> RankState: ...

    def load_rank_state(self, state: RankState, *, data_position: bool, rng: RngPolicy) -> None: ...


@dataclass
class SavedRankState:
    """A parsed rankNNNNN.json."""

    rank: int
    layout: dict[str, Any]
    config_keys: dict[str, Any]
    config_fingerprint: str | None
    state: RankState

    @property
    def step(self) -> int | None:
        step = self.state.train_state.get("step")
        return step if isinstance(step, int) else None


def write_rank_state(
    ckpt_dir: Path, ctx: DistContext, state: RankState, trajectory_keys: dict[str, Any]
) -> None:
    record = {
        "format": RANK_STATE_FORMAT,
        "version": 1,
        "rank": ctx.rank,
        "dp_rank": ctx.dp_rank,
        "tp_rank": ctx.tp_rank,
        "layout": ctx.layout(),
        "train_state": state.train_state,
        "loader": state.data_position,
        "rng": state.rng,
        "config_keys": trajectory_keys,
        "config_fingerprint": fingerprint(trajectory_keys),
        "saved_at": time.time(),
    }
    atomic_write(ckpt_dir / rank_state_name(ctx.rank), json.dumps(record, separators=(",", ":")).encode())


def read_rank_state(ckpt_dir: Path, rank: int) -> SavedRankState:
    """Parse rankNNNNN.json; VerifyError saying why when it is not a v1 rank-state file."""
    path = ckpt_dir / rank_state_name(rank)
    saved = read_json(path)
    if not isinstance(saved, dict) or saved.get("format") != RANK_STATE_FORMAT or saved.get("version") != 1:
        raise VerifyError(f"{path.name} is not a truestep rank-state file (v1)")
    if saved.get("rank") != rank or isinstance(saved.get("rank"), bool):
        raise VerifyError(f"{path.name} records rank {saved.get('rank')!r:.40}")
    tables = {k: saved.get(k) for k in ("layout", "train_state", "loader", "rng", "config_keys")}
    missing = [k for k, v in tables.items() if not isinstance(v, dict)]
    if missing:
        raise VerifyError(f"{path.name} lacks {', '.join(missing)}")
    fp = saved.get("config_fingerprint")
    return SavedRankState(
        rank=rank,
        layout=tables["layout"],
        config_keys=tables["config_keys"],
        config_fingerprint=fp if isinstance(fp, str) else None,
        state=RankState(tables["train_state"], tables["loader"], tables["rng"]),
    )


def rank_state_problem(ckpt_dir: Path, step: int | None) -> str | None:
    """Why the rank-state files of a checkpoint contradict each other or its directory, else None.

    Every rank file must parse and record the directory's step (a directory renamed from step 4 to step 8,
    or a rank file claiming step 10^9, is not that checkpoint), and the files must be exactly rank 0 to
    world_size - 1 of the recorded layout (a resume at the same layout reads each rank's own file).
    A weights-only checkpoint has no rank files: nothing to check here.
    """
    names = sorted(p.name for p in ckpt_dir.iterdir() if is_rank_state_name(p.name))
    if not names:
        return None
    first = read_rank_state(ckpt_dir, 0) if rank_state_name(0) in names else None
    if first is None:
        return f"{rank_state_name(0)} is missing"
    world = first.layout.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        return f"{rank_state_name(0)} records world_size {world!r:.40}"
    if names != [rank_state_name(r) for r in range(world)]:
        return f"{len(names)} rank-state files for world_size {world}"
    for rank in range(world):
        saved = first if rank == 0 else read_rank_state(ckpt_dir, rank)
        if saved.step != step or isinstance(saved.state.train_state.get("step"), bool):
            found = saved.state.train_state.get("step")
            return f"{rank_state_name(rank)} records step {found!r:.40}, the directory and marker say {step}"
    return None


def _read_for_resume(ckpt_dir: Path, rank: int) -> SavedRankState:
    try:
        return read_rank_state(ckpt_dir, rank)
    except VerifyError as err:
        raise ResumeError(f"{ckpt_dir}: {err}") from err


def check_config(saved: SavedRankState, current_keys: dict[str, Any], allow_change: bool) -> list[str]:
    """Differences in trajectory-relevant keys; raises unless allowed."""
    differences = diff_keys(saved.config_keys, current_keys)
    if differences and not allow_change:
        raise ResumeError(
            "refusing to resume: the config differs from the checkpoint's in keys that change the "
            "trajectory: " + "; ".join(differences) + ". Restore them, start a new run directory, or "
            "pass --checkpoint.allow_config_change=true to resume anyway."
        )
    return differences


def _raise_load_error(ckpt_dir: Path, err: BaseException) -> None:
    """A failed load as the refusal it is: the checkpoint's own bytes (CheckpointContentError, raised
    as is: the caller quarantines and falls back), a model that does not fit it, or an I/O error."""
    if isinstance(err, RefusedError | OSError) and not isinstance(err, TensorMismatchError):
        raise err
    if isinstance(err, TensorMismatchError):
        raise ResumeError(
            f"{ckpt_dir} does not fit the configured model ({err}); the config changed in a way that changes "
            "shapes: restore it or start a new run directory"
        ) from err
    raise ResumeError(
        f"{ckpt_dir} cannot be loaded into the configured model: {type(err).__name__}: {err}"
    ) from err


def restore(
    states: Checkpointable,
    ckpt_dir: Path,
    cfg: CheckpointConfig,
    ctx: DistContext,
    trajectory_keys: dict[str, Any],
    logs: RunLogs,
) -> dict[str, Any]:
    """Collective. Restore everything the switches allow; return facts for the restore event."""
    shared = _read_for_resume(ckpt_dir, 0)
    differences = check_config(shared, trajectory_keys, cfg.allow_config_change)
    same_layout = shared.layout == ctx.layout()

    state = states.dcp_state_dict(with_optimizer=cfg.restore_optimizer_state)
    weights_restored = True
    try:
        load_dcp(state, ckpt_dir, check_items=cfg.verify_checksums)  # each rank hashes what it reads
    except (Exception, CheckpointException) as err:  # DCP's CheckpointException is a BaseException
        if cfg.atomic_commit:
            _raise_load_error(ckpt_dir, err)
        # Ablation of atomic_commit: reproduce the naive trainer that trusts a torn directory, loads
        # what is there and carries on (strict=False style). Loud in the event log, silent in training.
        weights_restored = False
        logs.event("naive_partial_restore", path=str(ckpt_dir), error=f"{type(err).__name__}: {err}")
    if weights_restored:
        states.load_dcp_state_dict(state)

    if not cfg.restore_rng_state:
        policy = RngPolicy.FRESH_SEED
    elif same_layout:
        policy = RngPolicy.RESTORED
    else:
        policy = RngPolicy.REDERIVED
    mine = shared if ctx.rank == 0 or policy != RngPolicy.RESTORED else _read_for_resume(ckpt_dir, ctx.rank)
    own = RankState(shared.state.train_state, shared.state.data_position, mine.state.rng)
    try:
        states.load_rank_state(own, data_position=cfg.restore_data_position, rng=policy)
    except (KeyError, TypeError, ValueError, IndexError) as err:  # malformed streams or data position
        if isinstance(err, RefusedError):
            raise
        refusal = ResumeError(
            f"{ckpt_dir}: the rank state of rank {ctx.rank} does not load: {type(err).__name__}: {err}"
        )
        refusal.rank_local = True
        raise refusal from err
    return {
        "step": shared.step,
        "layout_changed": not same_layout,
        "saved_layout": shared.layout,
        "rng_policy": str(policy),
        "config_differences": differences,
        "restored_weights": weights_restored,
        "restored_optimizer": cfg.restore_optimizer_state and weights_restored,
        "restored_data_position": cfg.restore_data_position,
    }
