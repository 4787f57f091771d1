"""MTTR per fault: fault -> detected -> all ranks down -> relaunched -> restored -> first new step, and
the time to regain the step the run had reached before the fault. All from event timestamps."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from truestep.analysis.runlog import RunLog

PROCESS_FAULTS = ("kill", "hang", "crash", "corrupt", "term")


@dataclass
class Incident:
    kind: str
    fault_time: float
    pre_fault_step: int
    phases_s: dict[str, float | None]
    """detect, teardown, relaunch, restore (relaunch -> state restored; None when the fault came before the
    first checkpoint), first_step (None where the run never got there)."""
    mttr_s: float | None
    """fault -> first new step."""
    regain_s: float | None
    """fault -> the pre-fault step is reached again."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _first(times: list[float], after: float | None) -> float | None:
    if after is None:
        return None
    later = [t for t in times if t >= after]
    return min(later) if later else None


def incidents(run: RunLog) -> list[Incident]:
    found = []
    detected = [e["detected_at"] for e in run.named("failure_detected")]
    agreed = [e["time"] for e in run.named("signal_received")]
    down = [e["time"] for e in run.named("teardown_complete")]
    ends = [e["time"] for e in run.named("run_end")]
    relaunches = [e["time"] for e in run.named("attempt_start")] or [
        e.get("process_start", e["time"]) for e in run.named("run_start")
    ]
    starts = run.named("run_start")
    restores = {e["attempt"]: e for e in run.named("checkpoint_restore")}
    for fault in run.named("fault_injected"):
        if fault["kind"] not in PROCESS_FAULTS:
            continue
        t0 = fault["time"]
        graceful = fault["kind"] == "term"
        t_detect = _first(agreed if graceful else detected, t0)
        t_down = _first(ends if graceful else down, t_detect)
        t_relaunch = _first(relaunches, t_down)
        # The attempt that took over; it restores a checkpoint unless the fault came before the first one.
        successor = next((e for e in starts if t_relaunch is not None and e["time"] >= t_relaunch), None)
        attempt = successor["attempt"] if successor else None
        t_restore = restores[attempt]["time"] if attempt in restores else None
        after = t_restore if t_restore is not None else t_relaunch
        first_line = next(
            (
                m
                for m in run.metrics
                if attempt is not None and m["attempt"] == attempt and m["time"] >= after
            ),
            None,
        )
        t_first = first_line["time"] if first_line else None
        pre = max((m["step"] for m in run.metrics if m["time"] <= t0), default=0)
        regained = next(
            (m["time"] for m in run.metrics if t_first and m["time"] >= t_first and m["step"] >= pre), None
        )

        def span(a: float | None, b: float | None) -> float | None:
            return b - a if a is not None and b is not None else None

        found.append(
            Incident(
                kind=fault["kind"],
                fault_time=t0,
                pre_fault_step=pre,
                phases_s={
                    "detect": span(t0, t_detect),
                    "teardown": span(t_detect, t_down),
                    "relaunch": span(t_down, t_relaunch),
                    "restore": span(t_relaunch, t_restore),
                    "first_step": span(t_restore if t_restore is not None else t_relaunch, t_first),
                },
                mttr_s=span(t0, t_first),
                regain_s=span(t0, regained),
            )
        )
    return found
