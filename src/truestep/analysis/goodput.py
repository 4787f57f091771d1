"""Correct goodput, plain goodput and the badput breakdown of a whole job (all attempts included).

wall = last record - the job's start (the first process start, event or step, whichever came first);
plain goodput = steps on the final trajectory x tokens/step / wall;
correct goodput = steps the verdict vouches for (in the reference, before the first violation) x
tokens/step / wall.

Badput is computed as wall-clock *spans* (startup, restore, blocking saves, lost and unverifiable work,
detection, teardown, requeue waits, work after the violation); each bucket is the sum of its spans and
the timeline figure draws exactly these spans, so figure and table cannot disagree. `other` is the wall
clock no span covers; it is never clamped: if the spans add up to more than the wall clock, or two
attempts overlap, the result says so in `inconsistencies`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from truestep.analysis.idle import IDLE_KINDS, Idle, idle_periods, records_before
from truestep.analysis.restores import StepsLost, restore_events, steps_lost
from truestep.analysis.runlog import RunLog

WORK_KINDS = ("useful", "lost_work", "after_violation", "unverifiable")
BUCKETS = (
    "startup",
    "checkpoint_blocking",
    "restore",
    "lost_work",
    "unverifiable",
    "detection",
    "teardown",
    "requeue_wait",
    "after_violation",
)


@dataclass(frozen=True)
class Span:
    kind: str
    """`useful` or a badput bucket."""
    attempt: int | None
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Goodput:
    start_time: float
    attempts: dict[int, float]
    """Trainer attempt -> its first process start (the timeline's rows)."""
    wall_s: float
    steps: int
    correct_steps: int
    unverifiable_steps: int
    tokens_per_step: int
    plain_tokens_per_s: float
    correct_tokens_per_s: float
    useful_s: float
    badput_s: dict[str, float]
    """Every bucket of BUCKETS, plus `other` (the wall clock no span covers; negative = inconsistent)."""
    spans: list[Span] = field(default_factory=list)
    inconsistencies: list[str] = field(default_factory=list)
    after_completion: list[int] = field(default_factory=list)
    """Attempts launched after the job completed: named here, outside the wall clock (analysis/idle.py)."""
    steps_lost: StepsLost = field(default_factory=StepsLost)
    """Steps lost per recovery and where each came from (memory or disk; analysis/restores.py)."""


@dataclass(frozen=True)
class CheckpointOverhead:
    saves: int
    mean_blocking_s: float
    amortized_blocking_fraction: float
    """Σ blocking / (Σ step_time + Σ blocking)."""


def attempt_starts(run: RunLog) -> dict[int, float]:
    """Trainer attempt -> its first process start (run_start.process_start, else run_start's time; for a
    rank the warm template forked, the handoff, `run_start.handoff_at`, if earlier: a rank handed to a
    template still importing starts being it there, and the wait for its imports is its start-up, not a requeue wait)."""
    began: dict[int, float] = {}
    for e in run.named("run_start"):
        t = float(e.get("process_start", e["time"]))
        handoff = e.get("handoff_at")
        if isinstance(handoff, int | float) and not isinstance(handoff, bool) and math.isfinite(handoff):
            t = min(t, float(handoff))
        began[e["attempt"]] = min(began.get(e["attempt"], t), t)
    return dict(sorted(began.items()))


def attempt_at(starts: dict[int, float], t: float) -> int | None:
    """The attempt running at time t: the last one started at or before t (None before the first)."""
    current = None
    for attempt, began in starts.items():
        if began <= t:
            current = attempt
    return current


def _attempt_records(run: RunLog, attempt: int) -> list[float]:
    return [e["time"] for e in run.events if e.get("attempt") == attempt] + [
        m["time"] for m in run.attempt_metrics(attempt)
    ]


def _startup_and_restore(run: RunLog, starts: dict[int, float]) -> list[Span]:
    spans = []
    for attempt, began in starts.items():
        lines = run.attempt_metrics(attempt)
        end = (
            lines[0]["time"] - lines[0]["step_time"]
            if lines
            else max(_attempt_records(run, attempt), default=began)
        )
        restores = [e for e in restore_events(run) if e.get("attempt") == attempt]
        cursor = began
        # Only a restore before the first step is part of start-up (a later NaN rollback is not).
        for e in restores:
            r_start, r_end = e["time"] - e["restore_s"], e["time"]
            if r_end <= end:
                spans.append(Span("startup", attempt, cursor, max(cursor, r_start)))
                cursor = max(cursor, r_end)
        spans.append(Span("startup", attempt, cursor, max(cursor, end)))
        spans += [Span("restore", attempt, e["time"] - e["restore_s"], e["time"]) for e in restores]
    return [s for s in spans if s.duration > 0]


def _work(run: RunLog, violation: int | None, unverifiable: set[int]) -> list[Span]:
    lost = {id(m) for m in run.superseded}
    spans = []
    for m in run.metrics:
        if id(m) in lost:
            kind = "lost_work"
        elif m["step"] in unverifiable:
            kind = "unverifiable"
        elif violation is not None and m["step"] >= violation:
            kind = "after_violation"
        else:
            kind = "useful"
        spans.append(Span(kind, m["attempt"], m["time"] - m["step_time"], m["time"]))
    return spans


def _supervision(run: RunLog, starts: dict[int, float]) -> tuple[list[Span], list[str]]:
    """Detection, teardown and requeue-wait spans, and any overlap of consecutive attempts."""
    spans, problems = [], []
    faults = [f["time"] for f in run.named("fault_injected")]
    seen_failing: set[object] = set()
    for failure in run.named("failure_detected"):
        detected = failure.get("detected_at", failure["time"])
        before = [t for t in faults if t <= detected]
        last_seen = failure.get("last_seen")
        if before:
            spans.append(Span("detection", failure.get("attempt"), max(before), detected))
        elif isinstance(last_seen, int | float) and failure.get("attempt") not in seen_failing:
            # Nobody injected it: from the rank's last sign of health the supervisor recorded (once per
            # attempt: every node's supervisor may record the same failure).
            spans.append(Span("detection", failure.get("attempt"), min(float(last_seen), detected), detected))
        seen_failing.add(failure.get("attempt"))
    teardowns = run.named("teardown_complete")
    spans += [Span("teardown", e.get("attempt"), e["time"] - e["teardown_s"], e["time"]) for e in teardowns]
    ordered = list(starts.items())
    for (prev, _), (nxt, began) in zip(ordered, ordered[1:], strict=False):
        records = _attempt_records(run, prev) + [e["time"] for e in teardowns if e["time"] <= began]
        before = [t for t in records if t <= began]
        if before:
            spans.append(Span("requeue_wait", nxt, max(before), began))
        late = max(records, default=began) - began
        if late > 0:
            problems.append(
                f"attempt {prev} was still writing {late:.3g} s after attempt {nxt} started "
                "(an orphaned process?); the overlap is counted twice"
            )
    return [s for s in spans if s.duration > 0], problems


def goodput(
    run: RunLog, violation: int | None, unverifiable: set[int] | frozenset[int] = frozenset()
) -> Goodput:
    """`violation`: the verdict's first violation step; `unverifiable`: steps the reference lacks."""
    starts = attempt_starts(run)
    idle = idle_periods(run, starts)
    starts = {a: t for a, t in starts.items() if a not in idle.after_completion}
    spans = _startup_and_restore(run, starts) + _work(run, violation, set(unverifiable))
    spans += [
        Span("checkpoint_blocking", e.get("attempt"), e["time"] - e.get("blocking_s", 0.0), e["time"])
        for e in run.named("checkpoint_save")
        if e.get("blocking_s", 0.0) > 0
    ]
    supervision, problems = _supervision(run, starts)
    # Supervisor records carry no attempt: a span belongs to the attempt running when it began.
    spans = [
        s if s.attempt is not None else Span(s.kind, attempt_at(starts, s.start), s.start, s.end)
        for s in sorted(spans + supervision, key=lambda s: s.start)
    ]
    spans = _idle_spans(run, idle, [s for s in spans if s.start < idle.end])
    totals = {kind: 0.0 for kind in ("useful", *BUCKETS, *IDLE_KINDS)}
    for span in spans:
        totals[span.kind] += span.duration
    useful = totals.pop("useful")
    wall = idle.end - run.start_time
    other = wall - useful - sum(totals.values())
    if other < -1e-6 * max(1.0, wall):
        problems.append(
            f"the spans add up to {-other:.3g} s more than the wall clock ({wall:.3g} s): records overlap"
        )
    totals["other"] = other
    steps = [s for s in run.final_steps if s not in unverifiable]
    correct = sum(1 for s in steps if violation is None or s < violation)
    tps = run.tokens_per_step
    rate = 1.0 / wall if wall > 0 else 0.0
    return Goodput(
        start_time=run.start_time,
        attempts=starts,
        wall_s=wall,
        steps=len(run.final_steps),
        correct_steps=correct,
        unverifiable_steps=len(unverifiable),
        tokens_per_step=tps,
        plain_tokens_per_s=len(run.final_steps) * tps * rate,
        correct_tokens_per_s=correct * tps * rate,
        useful_s=useful,
        badput_s=totals,
        spans=spans,
        inconsistencies=problems,
        after_completion=idle.after_completion,
        steps_lost=steps_lost(run),
    )


def _idle_spans(run: RunLog, idle: Idle, spans: list[Span]) -> list[Span]:
    """A refused attempt is its own span. The wait before it stays a requeue wait when the job was
    waiting for a relaunch; the gap after it (and before one that followed no requeue) is `not_running`."""
    if not idle.refused:
        return spans
    out = []
    for span in spans:
        inside = [
            r
            for r in idle.refused.values()
            if span.kind == "requeue_wait" and span.start < r[1] and r[0] < span.end
        ]
        if not inside:
            out.append(span)
            continue
        cursor, kind = span.start, "requeue_wait"  # waiting for the relaunch, which came and was refused
        for first, last in sorted(inside):
            out.append(Span(kind, span.attempt, cursor, max(cursor, first)))
            cursor, kind = max(cursor, last), "not_running"  # after a refusal nothing relaunches the job
        out.append(Span("not_running", span.attempt, cursor, max(cursor, span.end)))
    for attempt, (first, last) in idle.refused.items():
        covered = any(s.kind in ("requeue_wait", "not_running") and s.end == first for s in out)
        before = records_before(run, first)
        if not covered and before:
            out.append(Span("not_running", attempt, max(before), first))
        out.append(Span("refused", attempt, first, last))
    return sorted((s for s in out if s.duration > 0), key=lambda s: s.start)


def checkpoint_overhead(run: RunLog) -> CheckpointOverhead:
    blocking = [e.get("blocking_s", 0.0) for e in run.named("checkpoint_save")]
    steps = [line["step_time"] for line in run.final_steps.values()]
    return CheckpointOverhead(
        saves=len(blocking),
        mean_blocking_s=sum(blocking) / len(blocking) if blocking else 0.0,
        amortized_blocking_fraction=sum(blocking) / max(1e-9, sum(steps) + sum(blocking)),
    )
