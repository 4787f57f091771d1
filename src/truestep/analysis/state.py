"""The parameter state itself as an observable: L2 distances of weights and optimizer moments between two
runs at the checkpoint steps both kept.

Why: the loss is one number per step, a projection of the state that can hide a change for many steps;
zeroed AdamW moments are plain in `exp_avg` at the first checkpoint after a resume, long before the loss
shows them, and a restore that is off by 1e-6 moves every weight but barely the loss. Distances are
taken per tensor and per kind (`params`, and each optimizer-state name: `exp_avg`, `exp_avg_sq`,
`step`); the verdict uses the per-kind totals, whose spread between floor runs is small (a sum over many
elements), and the report lists the tensors that moved most.

Checkpoints are read with the safe reader (checkpoint/state_reader.py: no unpickling, no process group),
only committed ones, only from the run's checkpoint root (checkpoint/catalog.py: `run_checkpoint_root`,
the same answer training used: `checkpoint.dir` of the run's own config.toml, else `<run>/checkpoints/`;
no log file can redirect it), a bounded number of bytes at a time. torch is imported only when checkpoints are actually read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from truestep.checkpoint.catalog import committed_dirs, run_checkpoint_root, step_of

if TYPE_CHECKING:
    from truestep.checkpoint.weights import TensorMeta

PARAMS = "params"
BATCH_BYTES = 256 << 20
"""Tensor bytes read per run per batch: the instrument's memory stays bounded for any model size."""


@dataclass(frozen=True)
class StateDistance:
    """Distances between a run's and the reference's checkpoint at one step."""

    step: int
    totals: dict[str, float]
    """Kind (`params`, `exp_avg`, ...) -> L2 norm of the difference over every tensor of that kind; inf
    where a tensor is in one checkpoint only or has another shape."""
    tensors: dict[str, float]
    """`kind:name` -> L2 norm of that tensor's difference."""
    scale: dict[str, float] = field(default_factory=dict)
    """Kind -> L2 norm of the reference's tensors of that kind (compared ones): what the resolution of
    a distance is measured against (analysis/floor.py)."""

    @property
    def nonzero(self) -> bool:
        return any(v != 0 for v in self.totals.values())


def kind_of(key: str) -> tuple[str, str]:
    """DCP key -> (kind, name): `model.x.weight` -> (params, x.weight); `optim.state.x.weight.exp_avg`
    -> (exp_avg, x.weight)."""
    if key.startswith("model."):
        return PARAMS, key[len("model.") :]
    rest = key[len("optim.state.") :]
    name, _, kind = rest.rpartition(".")
    return kind, name


def checkpoints(run_dir: Path) -> dict[int, Path]:
    """Step -> committed checkpoint directory of the run in `run_dir` (wherever it kept them)."""
    root = run_checkpoint_root(run_dir)
    return {step: d for d in committed_dirs(root) if (step := step_of(d)) is not None}


def _batches(meta: dict[str, TensorMeta]) -> list[dict[str, TensorMeta]]:
    batches: list[dict[str, TensorMeta]] = [{}]
    size = 0
    for key, m in meta.items():
        if batches[-1] and size + m.nbytes > BATCH_BYTES:
            batches.append({})
            size = 0
        batches[-1][key] = m
        size += m.nbytes
    return batches


class _ReferenceCache:
    """The reference's tensors, kept while they fit in BATCH_BYTES: every run of an experiment is compared
    with the same reference checkpoints, and reading a checkpoint costs far more than holding a small one."""

    def __init__(self) -> None:
        self.held: dict[tuple[Path, int, tuple[str, ...]], dict[str, Any]] = {}
        self.nbytes = 0

    def read(self, ckpt: Path, batch: dict[str, TensorMeta]) -> dict[str, Any]:
        from truestep.checkpoint.state_reader import read_tensors

        key = (ckpt.resolve(), ckpt.stat().st_mtime_ns, tuple(batch))
        if key in self.held:
            return self.held[key]
        tensors = read_tensors(ckpt, batch)
        size = sum(m.nbytes for m in batch.values())
        if self.nbytes + size <= BATCH_BYTES:
            self.held[key] = tensors
            self.nbytes += size
        return tensors


_REFERENCE = _ReferenceCache()


def distance_at(run_ckpt: Path, ref_ckpt: Path, step: int) -> StateDistance:
    """Distances between two checkpoints of one step, tensor by tensor (float64 arithmetic)."""
    from truestep.checkpoint.state_reader import read_tensors, stored_tensors

    run_meta, ref_meta = stored_tensors(run_ckpt), stored_tensors(ref_ckpt)
    squares: dict[str, float] = {}
    norms: dict[str, float] = {}
    tensors: dict[str, float] = {}
    common = {k: m for k, m in ref_meta.items() if k in run_meta and run_meta[k] == m}
    for key in sorted(set(run_meta) | set(ref_meta)):
        if key not in common:
            kind, name = kind_of(key)
            tensors[f"{kind}:{name}"] = math.inf
            squares[kind] = math.inf
    for batch in _batches(common):
        ours, theirs = read_tensors(run_ckpt, batch), _REFERENCE.read(ref_ckpt, batch)
        for key in batch:
            kind, name = kind_of(key)
            d = float((ours[key].double() - theirs[key].double()).norm())
            tensors[f"{kind}:{name}"] = d
            squares[kind] = squares.get(kind, 0.0) + d * d
            norms[kind] = norms.get(kind, 0.0) + float(theirs[key].double().norm()) ** 2
        del ours, theirs
    totals = {kind: math.sqrt(v) for kind, v in sorted(squares.items())}
    scale = {kind: math.sqrt(v) for kind, v in sorted(norms.items())}
    return StateDistance(step, totals, dict(sorted(tensors.items())), scale)


def distances(run_dir: Path, ref_dir: Path, steps: list[int] | None = None) -> list[StateDistance]:
    """Distances at every checkpoint step both runs kept (restricted to `steps` when given)."""
    ours, theirs = checkpoints(run_dir), checkpoints(ref_dir)
    common = sorted(s for s in ours if s in theirs and (steps is None or s in steps))
    return [distance_at(ours[s], theirs[s], s) for s in common]
