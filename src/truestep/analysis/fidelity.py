"""Trajectory fidelity of a run against a failure-free same-seed reference, and the same-seed floor.

Definitions (docs/measures.md has the formulas): runs are aligned by step on the trajectory each ended
on; Δloss_s = |loss_run(s) - loss_ref(s)|; a step is *bitwise equal* when the fp32 loss bit patterns
match; a step is *preserving* when Δloss_s <= margin * floor_loss and Δgrad_norm_s <= margin *
floor_grad_norm (both floors 0 on CPU, which makes "preserving" mean "bitwise equal").
"""

from __future__ import annotations

import math
import struct
from dataclasses import asdict, dataclass, field
from statistics import fmean
from typing import Any

from truestep.analysis.runlog import RunLog, finite_abs_diff

DEFAULT_MARGIN = 2.0


def loss_bits(x: float) -> bytes:
    return struct.pack(">f", x)


@dataclass
class Window:
    """The steps after one resume (up to the next resume or the end)."""

    resumed_at: int
    steps: int
    max_dloss: float
    mean_dloss: float
    max_dgrad_norm: float
    layout_changed: bool


@dataclass
class Fidelity:
    steps_compared: int
    missing_steps: list[int]
    max_dloss: float
    mean_dloss: float
    max_dgrad_norm: float
    first_divergent_step: int | None
    """First step whose loss bit pattern differs from the reference (or is missing)."""
    fraction_bitwise_equal: float
    windows: list[Window] = field(default_factory=list)
    digest_matches: dict[int, bool] = field(default_factory=dict)
    """Checkpoint step -> parameter digest equal to the reference's at that step."""
    final_digest_equal: bool | None = None
    layout_changed: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["digest_matches"] = {str(k): v for k, v in self.digest_matches.items()}
        return out


@dataclass
class Floor:
    """The deviation between two failure-free same-seed runs: the correctness threshold."""

    max_dloss: float
    max_dgrad_norm: float
    bitwise: bool


def _deltas(run: RunLog, ref: RunLog) -> dict[int, tuple[float, float, bool]]:
    out = {}
    for step, want in ref.final_steps.items():
        got = run.final_steps.get(step)
        if got is None:
            continue
        out[step] = (
            finite_abs_diff(got["loss"], want["loss"]),
            finite_abs_diff(got["grad_norm"], want["grad_norm"]),
            loss_bits(got["loss"]) == loss_bits(want["loss"]),
        )
    return out


def _windows(run: RunLog, deltas: dict[int, tuple[float, float, bool]]) -> list[Window]:
    """One window per resume: the final-trajectory steps computed by the attempt that resumed."""
    windows = []
    for event in run.named("checkpoint_restore"):
        steps = [
            s
            for s, line in run.final_steps.items()
            if line["attempt"] == event.get("attempt") and s in deltas
        ]
        dl = [deltas[s][0] for s in steps]
        windows.append(
            Window(
                resumed_at=event["step"],
                steps=len(steps),
                max_dloss=max(dl, default=0.0),
                mean_dloss=_mean(dl),
                max_dgrad_norm=max((deltas[s][1] for s in steps), default=0.0),
                layout_changed=bool(event.get("layout_changed")),
            )
        )
    return windows


def _mean(values: list[float]) -> float:
    if not values:
        return 0.0
    return fmean(values) if all(map(math.isfinite, values)) else math.inf


def compare(run: RunLog, ref: RunLog) -> Fidelity:
    deltas = _deltas(run, ref)
    missing = [s for s in ref.final_steps if s not in run.final_steps]
    first = next((s for s in ref.final_steps if s not in deltas or not deltas[s][2]), None)
    dl = [d[0] for d in deltas.values()]
    ref_digests, run_digests = ref.checkpoint_digests(), run.checkpoint_digests()
    final_run, final_ref = run.final_digest(), ref.final_digest()
    return Fidelity(
        steps_compared=len(deltas),
        missing_steps=missing,
        max_dloss=max(dl, default=0.0),
        mean_dloss=_mean(dl),
        max_dgrad_norm=max((d[1] for d in deltas.values()), default=0.0),
        first_divergent_step=first,
        fraction_bitwise_equal=sum(d[2] for d in deltas.values()) / max(1, len(ref.final_steps)),
        windows=_windows(run, deltas),
        digest_matches={s: run_digests[s] == d for s, d in ref_digests.items() if s in run_digests},
        final_digest_equal=(final_run == final_ref) if final_run and final_ref else None,
        layout_changed=bool(run.layout_changes()),
    )


def floor(repeat: RunLog, ref: RunLog) -> Floor:
    fid = compare(repeat, ref)
    return Floor(fid.max_dloss, fid.max_dgrad_norm, fid.first_divergent_step is None)


def first_violation(run: RunLog, ref: RunLog, base: Floor, margin: float = DEFAULT_MARGIN) -> int | None:
    """First step (in the reference's steps) that is missing or deviates beyond margin x floor."""
    deltas = _deltas(run, ref)
    for step in ref.final_steps:
        if step not in deltas:
            return step
        dloss, dgrad, _ = deltas[step]
        if dloss > margin * base.max_dloss or dgrad > margin * base.max_dgrad_norm:
            return step
    return None
