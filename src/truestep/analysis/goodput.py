"""Correct goodput, plain goodput and the badput breakdown of a whole job (all attempts included).

wall = last record - first record of the run directory (requeue waits between attempts included);
plain goodput = steps on the final trajectory x tokens/step / wall;
correct goodput = steps before the first fidelity violation x tokens/step / wall.
The badput buckets and the useful time add up to wall (the remainder is reported as `other`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from truestep.analysis.runlog import RunLog


@dataclass
class Goodput:
    wall_s: float
    steps: int
    correct_steps: int
    tokens_per_step: int
    plain_tokens_per_s: float
    correct_tokens_per_s: float
    badput_s: dict[str, float]
    useful_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _attempt_starts(run: RunLog) -> dict[int, float]:
    """Trainer attempt -> process start (recorded in run_start)."""
    return {e["attempt"]: e.get("process_start", e["time"]) for e in run.named("run_start")}


def badput(run: RunLog, violation: int | None) -> tuple[dict[str, float], float]:
    restores = run.named("checkpoint_restore")
    starts = _attempt_starts(run)
    startup = 0.0
    for attempt, began in starts.items():
        lines = run.attempt_metrics(attempt)
        if lines:
            first_step_start = lines[0]["time"] - lines[0]["step_time"]
            # Only the restore before the first step is part of start-up (not a later NaN rollback).
            initial = sum(
                e["restore_s"]
                for e in restores
                if e.get("attempt") == attempt and e["time"] <= first_step_start
            )
            startup += max(0.0, first_step_start - began - initial)
    faults = [e for e in run.named("fault_injected")]
    detection = 0.0
    for failure in run.named("failure_detected"):
        before = [f["time"] for f in faults if f["time"] <= failure["detected_at"]]
        if before:
            detection += failure["detected_at"] - max(before)
    wait = 0.0
    ordered = sorted(starts.items())
    for (prev, _), (_, began) in zip(ordered, ordered[1:], strict=False):
        prev_times = [e["time"] for e in run.events if e.get("attempt") == prev]
        prev_times += [m["time"] for m in run.attempt_metrics(prev)]
        prev_times += [e["time"] for e in run.named("teardown_complete") if e["time"] <= began]
        if prev_times:
            wait += max(0.0, began - max(t for t in prev_times if t <= began))
    kept = run.final_steps
    after = sum(line["step_time"] for s, line in kept.items() if violation is not None and s >= violation)
    useful = sum(line["step_time"] for s, line in kept.items() if violation is None or s < violation)
    buckets = {
        "startup": startup,
        "checkpoint_blocking": sum(e.get("blocking_s", 0.0) for e in run.named("checkpoint_save")),
        "restore": sum(e["restore_s"] for e in restores),
        "lost_work": sum(line["step_time"] for line in run.superseded),
        "detection": detection,
        "teardown": sum(e["teardown_s"] for e in run.named("teardown_complete")),
        "requeue_wait": wait,
        "after_violation": after,
    }
    buckets["other"] = max(0.0, run.wall_s - useful - sum(buckets.values()))
    return buckets, useful


def goodput(run: RunLog, violation: int | None) -> Goodput:
    steps = len(run.final_steps)
    correct = sum(1 for s in run.final_steps if violation is None or s < violation)
    tps = run.tokens_per_step
    wall = max(run.wall_s, 1e-9)
    buckets, useful = badput(run, violation)
    return Goodput(wall, steps, correct, tps, steps * tps / wall, correct * tps / wall, buckets, useful)


def checkpoint_overhead(run: RunLog) -> dict[str, float]:
    blocking = [e.get("blocking_s", 0.0) for e in run.named("checkpoint_save")]
    steps = [line["step_time"] for line in run.final_steps.values()]
    return {
        "saves": len(blocking),
        "mean_blocking_s": sum(blocking) / len(blocking) if blocking else 0.0,
        "amortized_blocking_fraction": sum(blocking) / max(1e-9, sum(steps) + sum(blocking)),
    }
