"""What a run looks like next to its failure-free same-seed reference, observable by observable.

`compare` computes, once, everything the verdict, the goodput, the report and its figures use (they
never recompute it): per step of the reference, |Δloss| and |Δgrad norm| and whether both bit patterns
match; the steps the run lacks (missing) and the steps the reference lacks (unverifiable); the parameter
digests at every step both logged one; the per-tensor distances of parameters and optimizer moments at
the checkpoint steps both kept (analysis/state.py); the per-resume windows. docs/measures.md has the
definitions; analysis/verdict.py judges them against the floor.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from statistics import fmean

from truestep.analysis.runlog import RunLog, finite_abs_diff
from truestep.analysis.state import StateDistance

DEFAULT_MARGIN = 2.0


def f32_bits(x: float) -> bytes:
    return struct.pack(">f", x)


@dataclass(frozen=True)
class StepDelta:
    """One step of the reference, seen in the run."""

    step: int
    dloss: float
    dgrad_norm: float
    bitwise: bool
    """Loss and grad norm have the reference's fp32 bit patterns."""


@dataclass(frozen=True)
class Window:
    """The steps after one resume (computed by the attempt that resumed)."""

    resumed_at: int
    steps: int
    max_dloss: float
    mean_dloss: float
    max_dgrad_norm: float
    layout_changed: bool


@dataclass
class Comparison:
    steps: list[StepDelta]
    """Every step of the reference that the run also has, in step order."""
    missing_steps: list[int]
    """Steps of the reference the run never logged: it did not get there."""
    unverifiable_steps: list[int]
    """Steps of the run the reference does not have (a longer run, or lines a stale attempt left past the
    job's end): nothing to compare them with, so never counted as correct."""
    digests: dict[int, bool]
    """Step -> the parameter digests of run and reference are equal (steps where both logged one)."""
    state: list[StateDistance] = field(default_factory=list)
    """Parameter and optimizer-moment distances at the checkpoint steps both runs kept."""
    windows: list[Window] = field(default_factory=list)
    layout_changed: bool = False
    config_differs: bool = False
    """Some attempt of the run had a config fingerprint other than the reference's."""

    @property
    def steps_compared(self) -> int:
        return len(self.steps)

    @property
    def max_dloss(self) -> float:
        return max((d.dloss for d in self.steps), default=0.0)

    @property
    def mean_dloss(self) -> float:
        return _mean([d.dloss for d in self.steps])

    @property
    def max_dgrad_norm(self) -> float:
        return max((d.dgrad_norm for d in self.steps), default=0.0)

    @property
    def fraction_bitwise_equal(self) -> float:
        total = len(self.steps) + len(self.missing_steps)
        return sum(d.bitwise for d in self.steps) / total if total else 1.0

    @property
    def first_divergent_step(self) -> int | None:
        """First step at which anything observable is not bit-identical: a loss or grad norm bit pattern,
        a missing step, a parameter digest, a nonzero state distance."""
        found = [d.step for d in self.steps if not d.bitwise] + self.missing_steps
        found += [s for s, equal in self.digests.items() if not equal]
        found += [d.step for d in self.state if d.nonzero]
        return min(found, default=None)

    @property
    def bitwise(self) -> bool:
        return self.first_divergent_step is None


def _mean(values: list[float]) -> float:
    if not values:
        return 0.0
    return fmean(values) if all(map(math.isfinite, values)) else math.inf


def step_deltas(run: RunLog, ref: RunLog) -> list[StepDelta]:
    out = []
    for step, want in ref.final_steps.items():
        got = run.final_steps.get(step)
        if got is not None:
            bitwise = f32_bits(got["loss"]) == f32_bits(want["loss"]) and f32_bits(
                got["grad_norm"]
            ) == f32_bits(want["grad_norm"])
            out.append(
                StepDelta(
                    step,
                    finite_abs_diff(got["loss"], want["loss"]),
                    finite_abs_diff(got["grad_norm"], want["grad_norm"]),
                    bitwise,
                )
            )
    return out


def _windows(run: RunLog, deltas: dict[int, StepDelta]) -> list[Window]:
    """One window per resume: the final-trajectory steps computed by the attempt that resumed (an
    attempt's first restore; a later NaN rollback inside it is not a resume)."""
    windows, seen = [], set()
    for event in run.named("checkpoint_restore"):
        attempt = event.get("attempt")
        if attempt in seen:
            continue
        seen.add(attempt)
        mine = [
            deltas[s] for s, line in run.final_steps.items() if line["attempt"] == attempt and s in deltas
        ]
        dl = [d.dloss for d in mine]
        windows.append(
            Window(
                resumed_at=event["step"],
                steps=len(mine),
                max_dloss=max(dl, default=0.0),
                mean_dloss=_mean(dl),
                max_dgrad_norm=max((d.dgrad_norm for d in mine), default=0.0),
                layout_changed=bool(event.get("layout_changed")),
            )
        )
    return windows


def compare(run: RunLog, ref: RunLog, state: list[StateDistance] | None = None) -> Comparison:
    """Everything observable about `run` next to `ref`. `state` is analysis.state.distances(run, ref)
    when the checkpoints were read (they are read once, by the caller that knows which steps count)."""
    deltas = step_deltas(run, ref)
    ref_digests, run_digests = ref.digests(), run.digests()
    ref_prints = set(ref.fingerprints())
    return Comparison(
        steps=deltas,
        missing_steps=[s for s in ref.final_steps if s not in run.final_steps],
        unverifiable_steps=[s for s in run.final_steps if s not in ref.final_steps],
        digests={s: run_digests[s] == d for s, d in ref_digests.items() if s in run_digests},
        state=list(state or []),
        windows=_windows(run, {d.step: d for d in deltas}),
        layout_changed=bool(run.layout_changes()),
        config_differs=bool(ref_prints) and any(p not in ref_prints for p in run.fingerprints()),
    )
