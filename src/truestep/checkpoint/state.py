"""The rank-state file: everything beyond DCP that shapes the trajectory, per rank.

What is saved is handed over by the trainer through the `Checkpointable` protocol (the way torchtitan
hands over `Stateful` objects): DCP-able weights and optimizer state, and a JSON-safe `RankState`
(counters, data position, RNG streams). This module owns the `rankNNNNN.json` format around it (layout,
trajectory config keys and fingerprint); the restore is checkpoint/restore.py. Per-rank files because DCP
keeps only one rank's copy of a non-DTensor value stored under a shared key.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from truestep.checkpoint.catalog import is_rank_state_name, rank_state_name
from truestep.checkpoint.manifest import VerifyError, read_json
from truestep.checkpoint.restored import RngPolicy
from truestep.config.fingerprint import fingerprint
from truestep.core.fsio import atomic_write
from truestep.parallel.dist import DistContext

__all__ = ["Checkpointable", "RankState", "RngPolicy", "SavedRankState"]

RANK_STATE_FORMAT = "truestep-rank-state"


@dataclass
class RankState:
    """One rank's JSON-safe state beyond DCP."""

    train_state: dict[str, Any]
    """Step and accounting counters (TrainState)."""
    data_position: dict[str, Any]
    """The loader's state (the next global batch)."""
    rng: dict[str, Any]
    """Every RNG stream of the rank."""


def rank_state_from(fields: dict[str, Any]) -> RankState:
    """A RankState from its fields (`vars(state)`, as a memory snapshot keeps it); TypeError unless each
    field is a JSON object."""
    values = {name: fields.get(name) for name in ("train_state", "data_position", "rng")}
    if not all(isinstance(v, dict) for v in values.values()):
        raise TypeError("a rank state's train_state, data_position and rng must be JSON objects")
    return RankState(**values)


class Checkpointable(Protocol):
    """What a checkpoint saves and loads; the trainer implements it."""

    def dcp_state_dict(self, with_optimizer: bool) -> dict[str, Any]: ...

    def load_dcp_state_dict(self, state: dict[str, Any]) -> None: ...

    def rank_state(self) -> RankState: ...

    def load_rank_state(self, state: RankState, *, data_position: bool, rng: RngPolicy) -> None: ...

    def param_digest(self) -> str:
        """Collective: the digest of the parameters as they are now (telemetry/digest.py)."""
        ...


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
