"""What a plan computes from its inputs: the headline at the chosen interval, the interval sweep with the
simulated optimum beside Young's and Daly's, each mechanism switched off, the ±50 % sensitivity table,
and goodput against GPU count. Every number is a mean over replicas with its 5-95 % spread."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from truestep.plan.budget import ITERATION_SLACK, MAX_INTERRUPTIONS, check_setting, fits
from truestep.plan.build import Assembled
from truestep.plan.formulas import daly_interval, young_interval
from truestep.plan.inputs import PlanInputs, get, put
from truestep.plan.scenario import (
    VARIANTS,
    blocking_s,
    daly_for,
    interrupt_rate,
    params,
    planned_interval,
    round_interval,
    variant,
)
from truestep.plan.simulate import SIM_BUCKETS, SimResult, concat, simulate

if TYPE_CHECKING:
    from truestep.plan.snapshots import SnapshotStudy

SWEEP_GPUS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 100000)
SENSITIVE = (
    "failures.gpu_mtbf_hours",
    "failures.hang_fraction",
    "failures.node_loss_fraction",
    "failures.preemptions_per_day",
    "failures.preemption_notice_s",
    *(
        f"costs.{k}"
        for k in (
            "save_blocking_s",
            "save_write_s",
            "save_commit_s",
            "restore_s",
            "startup_cold_s",
            "startup_warm_s",
            "detect_crash_s",
            "detect_hang_s",
            "teardown_s",
            "restart_delay_s",
            "requeue_delay_s",
            "node_replace_s",
            "graceful_stop_s",
            "other_per_attempt_s",
        )
    ),
    "job.step_overhead_s",
)
"""Inputs the sensitivity table varies by ±50 % (plus the checkpoint interval)."""


@dataclass
class Stat:
    mean: float
    p5: float
    p95: float
    se: float
    """Standard error of the mean."""


def stat(x: np.ndarray) -> Stat:
    return Stat(
        float(x.mean()),
        float(np.percentile(x, 5)),
        float(np.percentile(x, 95)),
        float(x.std(ddof=1) / math.sqrt(x.size)),
    )


@dataclass
class Headline:
    interval_s: float
    plain: Stat
    correct: Stat
    wall_s: Stat
    lost_work_s: Stat
    badput_s: dict[str, Stat]
    failures: Stat
    preemptions: Stat
    mttr_s: Stat
    """Recovery per interruption (detection + teardown + relaunch + start-up + restore): the mean over all
    interruptions, the percentiles over replicas that had one."""


@dataclass
class IntervalSweep:
    intervals_s: list[float]
    plain: list[float]
    correct: list[float]
    optimum_s: float
    optimum_p5_s: float
    optimum_p95_s: float
    """Bootstrap (over replicas) 5-95 % range of the optimum."""
    young_s: float
    daly_s: float
    delta_s: float
    """Checkpoint cost in the formulas: what one save stalls training."""
    mtbf_s: float
    """Mean time between interruptions that lose work, of the whole job."""


@dataclass
class SensitivityRow:
    key: str
    value: float
    low: float
    """Correct goodput with the input at 50 %."""
    high: float
    """... at 150 %."""


@dataclass
class PlanResult:
    headline: Headline
    intervals: IntervalSweep
    mechanisms: dict[str, tuple[Stat, Stat, float]]
    """Variant -> (plain, correct, interval) at the target size."""
    sensitivity: list[SensitivityRow]
    base_correct: float
    """Correct goodput of the sensitivity table's baseline (its replicas)."""
    sweep_gpus: list[int]
    sweep: dict[str, list[float]]
    """Variant -> mean correct goodput at each GPU count; `plain (all on)` too."""
    timings_s: dict[str, float] = field(default_factory=dict)
    unscaled_correct: tuple[float, float] | None = None
    """Mean correct goodput with the costs measured at another scale as measured, and at truestep's
    at-scale assumptions (Assembled.unscaled), side by side at the headline's interval; None when every
    cost was measured at the target's size, extrapolated, set or assumed."""
    snapshots: SnapshotStudy | None = None
    """Peer snapshots off vs every k steps (plan/snapshots.py); None without a step time."""


def _run(
    settings: list[PlanInputs], intervals: list[float], replicas: int, seed: int, what: str = "the plan"
) -> list[SimResult]:
    """Simulate settings side by side (common random numbers) and split the result per setting; a
    setting the simulation cannot finish in bounded time is refused first (plan/budget.py)."""
    for s, t in zip(settings, intervals, strict=True):
        check_setting(s, t, what)
    res = simulate(
        concat([params(s, replicas, t) for s, t in zip(settings, intervals, strict=True)]),
        seed,
        replicas,
        max_iterations=MAX_INTERRUPTIONS * ITERATION_SLACK,
    )
    return [res.part(slice(j * replicas, (j + 1) * replicas)) for j in range(len(settings))]


def headline(inputs: PlanInputs, interval_s: float) -> Headline:
    r = _run([inputs], [interval_s], inputs.job.replicas, inputs.job.seed, "the headline")[0]
    interruptions = r.failures + r.preemptions
    hit = interruptions > 0
    mttr = stat(r.recovery_s[hit] / interruptions[hit]) if hit.sum() > 1 else Stat(0.0, 0.0, 0.0, 0.0)
    if hit.any():  # the mean over interruptions, not over replicas (a replica with more counts more)
        mttr.mean = float(r.recovery_s.sum() / interruptions.sum())
    return Headline(
        interval_s,
        stat(r.plain_goodput),
        stat(r.correct_goodput),
        stat(r.wall_s),
        stat(r.badput_s["lost_work"]),
        {k: stat(r.badput_s[k]) for k in SIM_BUCKETS},
        stat(r.failures),
        stat(r.preemptions),
        mttr,
    )


def _fit_optimum(taus: np.ndarray, walls: np.ndarray) -> np.ndarray:
    """Fit wall = a/τ + bτ + c around the grid minimum (the first-order shape of the waste), per column of
    `walls` (len(taus), B); returns the minimizer sqrt(a/b) of each, or the grid minimum if the fit is
    not convex."""
    best = np.argmin(walls, axis=0)
    out = np.empty(walls.shape[1])
    for j in range(walls.shape[1]):
        near = np.abs(np.log(taus / taus[best[j]])) <= math.log(2.5)
        if near.sum() < 4:
            out[j] = taus[best[j]]
            continue
        x = taus[near]
        design = np.stack([1.0 / x, x, np.ones_like(x)], axis=1)
        a, b, _ = np.linalg.lstsq(design, walls[near, j], rcond=None)[0]
        out[j] = math.sqrt(a / b) if a > 0 and b > 0 else taus[best[j]]
        out[j] = min(max(out[j], x.min()), x.max())
    return out


def _left_out(notes: list[str] | None, what: str, names: list[str]) -> None:
    if names and notes is not None:
        notes.append(
            f"{what} leaves out {', '.join(names)}: a replica would see more than {MAX_INTERRUPTIONS} "
            "interruptions there (plan/budget.py)"
        )


def interval_sweep(inputs: PlanInputs, replicas: int, notes: list[str] | None = None) -> IntervalSweep:
    """Goodput at 15 intervals around Daly's (those the simulation can finish: `notes` says which were
    left out), the simulated optimum with its bootstrap range, Young's and Daly's."""
    center = daly_for(inputs)
    factors = np.exp(np.linspace(math.log(1 / 6), math.log(6), 15))
    every = sorted({round_interval(inputs, center * f) for f in factors})
    grid = [t for t in every if fits(inputs, t)]
    if not grid:
        check_setting(inputs, center, "the interval sweep")  # refuses: no interval can be simulated
    _left_out(notes, "the interval sweep", [f"{t:.3g} s" for t in every if t not in grid])
    taus = np.array(grid)
    runs = _run([inputs] * len(grid), grid, replicas, inputs.job.seed + 1, "the interval sweep")
    walls = np.stack([r.wall_s for r in runs])  # (taus, replicas)
    optimum = float(_fit_optimum(taus, walls.mean(axis=1, keepdims=True))[0])
    rng = np.random.default_rng(inputs.job.seed + 2)
    counts = np.stack(
        [np.bincount(rng.integers(0, replicas, replicas), minlength=replicas) for _ in range(200)]
    )
    boot = _fit_optimum(taus, walls @ counts.T / replicas)
    rate = interrupt_rate(inputs)
    mtbf = 1.0 / rate if rate > 0 else math.inf
    delta = blocking_s(inputs)
    return IntervalSweep(
        grid,
        [float(r.plain_goodput.mean()) for r in runs],
        [float(r.correct_goodput.mean()) for r in runs],
        round_interval(inputs, optimum),
        float(np.percentile(boot, 5)),
        float(np.percentile(boot, 95)),
        young_interval(delta, mtbf),
        daly_interval(delta, mtbf),
        delta,
        mtbf,
    )


def mechanisms(
    inputs: PlanInputs, replicas: int, notes: list[str] | None = None
) -> dict[str, tuple[Stat, Stat, float]]:
    """Each variant (all on, then each mechanism off) at its interval; a variant the simulation cannot
    finish is left out and named in `notes` (all on never is: it is the job planned)."""
    every = {name: variant(inputs, name) for name in VARIANTS}
    taus = {name: _interval(inputs, s) for name, s in every.items()}
    names = [n for n in VARIANTS if n == "all on" or fits(every[n], taus[n])]
    _left_out(notes, "the mechanism table", [n for n in VARIANTS if n not in names])
    runs = _run(
        [every[n] for n in names],
        [taus[n] for n in names],
        replicas,
        inputs.job.seed + 3,
        "the mechanism table",
    )
    return {
        name: (stat(r.plain_goodput), stat(r.correct_goodput), taus[name])
        for name, r in zip(names, runs, strict=True)
    }


def _interval(user: PlanInputs, setting: PlanInputs) -> float:
    """The user's interval if set, else Daly's for this setting."""
    planned = planned_interval(user)
    return round_interval(setting, planned) if planned > 0 else daly_for(setting)


def sensitivity(
    inputs: PlanInputs, interval_s: float, replicas: int, notes: list[str] | None = None
) -> tuple[float, list[SensitivityRow]]:
    """Correct goodput with each input at 50 % and 150 % (and the interval); an input whose change the
    simulation cannot finish is left out and named in `notes`."""
    settings, taus, rows, dropped = [inputs], [interval_s], [], []
    keys = [k for k in SENSITIVE if get(inputs, k) > 0]
    if inputs.failures.model == "llama3":
        keys = [
            k
            for k in keys
            if k not in ("failures.gpu_mtbf_hours", "failures.hang_fraction", "failures.node_loss_fraction")
        ]
    for key in list(keys):
        pair = []
        for factor in (0.5, 1.5):
            changed = copy.deepcopy(inputs)
            value = get(inputs, key) * factor
            put(changed, key, min(value, 1.0) if key.endswith("_fraction") else value)
            pair.append(changed)
        if not all(fits(s, interval_s) for s in pair):
            keys.remove(key)
            dropped.append(key)
            continue
        settings += pair
        taus += [interval_s, interval_s]
    pair_taus = [round_interval(inputs, interval_s * factor) for factor in (0.5, 1.5)]
    if all(fits(inputs, t) for t in pair_taus):
        settings += [inputs, inputs]
        taus += pair_taus
    else:
        dropped.append("job.checkpoint_interval_s")
    _left_out(notes, "the sensitivity table", dropped)
    runs = _run(settings, taus, replicas, inputs.job.seed + 4, "the sensitivity table")
    means = [float(r.correct_goodput.mean()) for r in runs]
    rowed = [*keys] + ([] if "job.checkpoint_interval_s" in dropped else ["job.checkpoint_interval_s"])
    for n, key in enumerate(rowed):
        value = interval_s if key == "job.checkpoint_interval_s" else float(get(inputs, key))
        rows.append(SensitivityRow(key, value, means[1 + 2 * n], means[2 + 2 * n]))
    rows.sort(key=lambda row: -abs(row.high - row.low))
    return means[0], rows


def gpu_sweep(a: Assembled, replicas: int) -> tuple[list[int], dict[str, list[float]]]:
    """Correct goodput of every variant at each GPU count of SWEEP_GPUS the simulation can finish in
    bounded time (plan/budget.py); the sizes left out are said in a note."""
    settings, taus, names, sizes, dropped = [], [], [], [], []
    for gpus in SWEEP_GPUS:
        at = copy.deepcopy(a.inputs)
        at.job.gpus = gpus
        for key, value in a.costs.at(gpus).items():
            put(at, f"costs.{key}", value)
        variants = [variant(at, name) for name in VARIANTS]
        intervals = [_interval(a.inputs, s) for s in variants]
        if not all(fits(s, t) for s, t in zip(variants, intervals, strict=True)):
            dropped.append(gpus)
            continue
        sizes.append(gpus)
        settings += variants
        taus += intervals
        names += list(VARIANTS)
    _left_out(a.notes, "goodput vs GPU count", [f"{g} GPUs" for g in dropped])
    runs = _run(settings, taus, replicas, a.inputs.job.seed + 5, "goodput vs GPU count") if settings else []
    curves: dict[str, list[float]] = {name: [] for name in VARIANTS}
    curves["plain (all on)"] = []
    for name, r in zip(names, runs, strict=True):
        curves[name].append(float(r.correct_goodput.mean()))
        if name == "all on":
            curves["plain (all on)"].append(float(r.plain_goodput.mean()))
    return sizes, curves


class _Timer:
    """Says what is being simulated and records how long it took."""

    def __init__(self, progress: Callable[[str], None] | None) -> None:
        self.progress = progress
        self.timings: dict[str, float] = {}
        self._name, self._started = "", 0.0

    def __call__(self, name: str) -> _Timer:
        self._name = name
        return self

    def __enter__(self) -> None:
        if self.progress:
            self.progress(self._name)
        self._started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timings[self._name] = time.perf_counter() - self._started


def make_plan(
    a: Assembled, sweep_replicas: int = 200, progress: Callable[[str], None] | None = None
) -> PlanResult:
    """Everything the report shows. `sweep_replicas`: replicas per setting of the sweeps and tables."""
    inputs, timer = a.inputs, _Timer(progress)
    small = min(sweep_replicas, inputs.job.replicas)
    planned = planned_interval(inputs)
    # Refuse a job that cannot be simulated before simulating anything (plan/budget.py).
    check_setting(
        inputs, round_interval(inputs, planned) if planned > 0 else daly_for(inputs), "the headline"
    )
    with timer("checkpoint interval sweep"):
        sweep = interval_sweep(inputs, small, a.notes)
    chosen = round_interval(inputs, planned) if planned > 0 else sweep.optimum_s
    with timer("headline"):
        head = headline(inputs, chosen)
    with timer("mechanisms"):
        mech = mechanisms(inputs, small, a.notes)
    with timer("sensitivity"):
        base, rows = sensitivity(inputs, chosen, small, a.notes)
    with timer("goodput vs GPU count"):
        sizes, curves = gpu_sweep(a, max(50, small // 2))
    unscaled = None
    if a.unscaled:
        with timer("costs measured at another scale"):
            assumed = copy.deepcopy(inputs)
            for key, (_, high) in a.unscaled.items():
                put(assumed, key, high)
            runs = _run([inputs, assumed], [chosen, chosen], small, inputs.job.seed + 6, "the unscaled costs")
            unscaled = (float(runs[0].correct_goodput.mean()), float(runs[1].correct_goodput.mean()))
    from truestep.plan.snapshots import snapshot_study  # it runs settings through _run, here

    with timer("peer snapshots"):
        snaps = snapshot_study(a, chosen, small)
    result = PlanResult(head, sweep, mech, rows, base, sizes, curves, timer.timings)
    result.unscaled_correct = unscaled
    result.snapshots = snaps
    return result
