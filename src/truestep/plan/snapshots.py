"""What peer snapshots buy (mechanisms.snapshot_every_steps; docs/plan.md "Peer snapshots"): the job with
snapshots off and every k steps, side by side (common random numbers), at the headline's checkpoint
interval, and correct goodput with and without them at every GPU count of the sweep.

The model (plan/simulate.py, scenario.py): every k steps a snapshot stalls training by the agreement
(`costs.snapshot_agree_s`) and what the next step's forward and backward do not hide of its capture
(`costs.snapshot_capture_s` beyond the step time), an overhead of that stall / k per step; a failure restores the last agreed snapshot (taken every k steps, agreed
one step later) from peers' memory in `costs.memory_restore_s`, losing at most k steps, unless its buddies
were lost with it (`failures.memory_fallback_fraction`) or a preemption killed the whole job: then the
newest committed checkpoint serves, as without snapshots. k steps need a step time: without
job.step_time_s there is nothing to compare, and the plan says so.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from truestep.plan.build import Assembled
from truestep.plan.inputs import PlanInputs, put
from truestep.plan.scenario import daly_for, planned_interval, round_interval, snapshot_overhead_s
from truestep.plan.simulate import SimResult
from truestep.plan.study import SWEEP_GPUS, Stat, _run, stat

WHAT_IF_K = (1, 10)
"""The snapshot intervals shown beside the one planned (a plan with snapshots off shows what these buy)."""


@dataclass
class SnapshotRow:
    k: int
    """Snapshots every k steps; 0 = off."""
    plain: Stat
    correct: Stat
    steps_lost: float
    """Mean steps lost per interruption that lost work (failures, and preemptions that killed the job)."""
    from_memory: float
    """Fraction of those interruptions restored from peers' memory (the rest from disk)."""
    mttr_s: float
    """Mean recovery per interruption (detection, teardown, relaunch, start-up, restore)."""
    overhead: float
    """Snapshot stalls as a fraction of training wall time (stall / k per step)."""


@dataclass
class SnapshotStudy:
    interval_s: float
    """The checkpoint interval every row was simulated at (the headline's)."""
    rows: list[SnapshotRow]
    sweep_gpus: list[int] = field(default_factory=list)
    sweep: dict[int, list[float]] = field(default_factory=dict)
    """k (0 = off, the planned k and the what-ifs) -> mean correct goodput at each GPU count."""
    sweep_lost: dict[int, list[float]] = field(default_factory=dict)
    """k -> mean steps lost per interruption that lost work, at each GPU count."""


def with_k(inputs: PlanInputs, k: int) -> PlanInputs:
    out = copy.deepcopy(inputs)
    out.mechanisms.snapshot_every_steps = k
    return out


def ks(inputs: PlanInputs) -> list[int]:
    """Off, the planned k, and the what-ifs."""
    return sorted({0, *WHAT_IF_K, inputs.mechanisms.snapshot_every_steps})


def _means(inputs: PlanInputs, r: SimResult) -> tuple[float, float, float]:
    assert r.hard_stops is not None and r.from_memory is not None
    stops = float(r.hard_stops.sum())
    lost = float(r.badput_s["lost_work"].sum()) / inputs.job.step_time_s
    interruptions = float((r.failures + r.preemptions).sum())
    return (
        lost / stops if stops else 0.0,
        float(r.from_memory.sum()) / stops if stops else 0.0,
        float(r.recovery_s.sum()) / interruptions if interruptions else 0.0,
    )


def row(inputs: PlanInputs, k: int, r: SimResult) -> SnapshotRow:
    lost, memory, mttr = _means(inputs, r)
    job = inputs.job
    stall = snapshot_overhead_s(with_k(inputs, k))
    return SnapshotRow(
        k,
        stat(r.plain_goodput),
        stat(r.correct_goodput),
        lost,
        memory,
        mttr,
        stall / (job.step_time_s + job.step_overhead_s + stall),
    )


def snapshot_study(a: Assembled, interval_s: float, replicas: int) -> SnapshotStudy | None:
    """None when the job has no step time (k steps mean nothing without one)."""
    inputs = a.inputs
    if inputs.job.step_time_s <= 0:
        return None
    chosen = ks(inputs)
    settings = [with_k(inputs, k) for k in chosen]
    runs = _run(settings, [interval_s] * len(settings), replicas, inputs.job.seed + 7)
    study = SnapshotStudy(interval_s, [row(s, k, r) for s, k, r in zip(settings, chosen, runs, strict=True)])
    sweep_k = chosen
    grid, taus, keys = [], [], []
    for gpus in SWEEP_GPUS:
        at = copy.deepcopy(inputs)
        at.job.gpus = gpus
        for key, value in a.costs.at(gpus).items():
            put(at, f"costs.{key}", value)
        for k in sweep_k:
            s = with_k(at, k)
            planned = planned_interval(inputs)
            grid.append(s)
            taus.append(round_interval(s, planned) if planned > 0 else daly_for(with_k(at, 0)))
            keys.append(k)
    swept = _run(grid, taus, max(50, replicas // 2), inputs.job.seed + 8)
    study.sweep_gpus = list(SWEEP_GPUS)
    for s, k, r in zip(grid, keys, swept, strict=True):
        study.sweep.setdefault(k, []).append(float(np.mean(r.correct_goodput)))
        study.sweep_lost.setdefault(k, []).append(_means(s, r)[0])
    return study
