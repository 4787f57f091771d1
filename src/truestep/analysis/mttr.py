"""MTTR per fault: fault -> detected -> all ranks down -> relaunched -> restored -> first new step, and
the time to regain the step the run had reached before the fault. All from event timestamps.

Events are joined by attempt number (job-wide, docs/resilience.md), not by "the next event of that name":
the fault's attempt is the one that went down, the next attempt is the one that recovered. So a `term`
whose attempt then crashed in its emergency save is down when the supervisor tore it down (there is no
`run_end` of that attempt), and a NaN rollback later in the recovering attempt is not its restore.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from truestep.analysis.goodput import attempt_at, attempt_starts
from truestep.analysis.runlog import RunLog

PROCESS_FAULTS = ("kill", "hang", "crash", "crash-in-save", "corrupt", "term")
PHASES = ("detect", "teardown", "relaunch", "restore", "first_step")


@dataclass(frozen=True)
class Incident:
    kind: str
    attempt: int | None
    fault_time: float
    pre_fault_step: int
    phases_s: dict[str, float | None]
    """detect, teardown, relaunch, restore (relaunch -> state restored; None when the fault came before the
    first checkpoint), first_step (None where the run never got there)."""
    mttr_s: float | None
    """fault -> first new step."""
    regain_s: float | None
    """fault -> the pre-fault step is reached again."""
    startup_s: dict[str, float] | None = None
    """Where the recovering attempt's own start-up went (its `run_start.startup_phases`: import, build,
    init, verify, load seconds on rank 0); None where it never logged one."""


def _first(events: list[dict[str, Any]], after: float | None, key: str = "time") -> float | None:
    if after is None:
        return None
    later = [e.get(key, e["time"]) for e in events if e.get(key, e["time"]) >= after]
    return min(later) if later else None


def _span(a: float | None, b: float | None) -> float | None:
    return b - a if a is not None and b is not None else None


def _down(run: RunLog, fault: dict[str, Any], attempt: int | None, t_detect: float | None) -> float | None:
    """When every rank of the fault's attempt was down."""
    if fault["kind"] == "term":
        ends = [e for e in run.named("run_end") if e.get("attempt") == attempt]
        if ends:
            return _first(ends, t_detect)
        # The attempt did not end cleanly after the signal (e.g. a crash in its emergency save): it was
        # down when the supervisor finished tearing it down.
        failures = [e for e in run.named("failure_detected") if e.get("attempt", attempt) == attempt]
        t_failed = _first(failures, fault["time"], "detected_at")
        return _first(run.named("teardown_complete"), t_failed)
    return _first(run.named("teardown_complete"), t_detect)


def incidents(run: RunLog) -> list[Incident]:
    found = []
    starts = attempt_starts(run)
    launches: dict[int, float] = {}
    for e in run.named("attempt_start"):
        if "attempt" in e:
            launches.setdefault(e["attempt"], e["time"])
    for fault in run.named("fault_injected"):
        if fault["kind"] not in PROCESS_FAULTS:
            continue
        t0 = fault["time"]
        attempt = fault.get("attempt", attempt_at(starts, t0))
        if fault["kind"] == "term":
            agreed = [e for e in run.named("signal_received") if e.get("attempt", attempt) == attempt]
            t_detect = _first(agreed, t0)
        else:
            failures = [e for e in run.named("failure_detected") if e.get("attempt", attempt) == attempt]
            t_detect = _first(failures, t0, "detected_at")
        t_down = _down(run, fault, attempt, t_detect)
        # The attempt that took over: the first one after the fault's, launched once it was down.
        later = sorted(a for a in set(starts) | set(launches) if attempt is None or a > attempt)
        successor = next(
            (a for a in later if t_down is not None and launches.get(a, starts.get(a, -1)) >= t_down), None
        )
        t_relaunch = launches.get(successor, starts.get(successor)) if successor is not None else None
        restores = [e for e in run.named("checkpoint_restore") if e.get("attempt") == successor]
        t_restore = restores[0]["time"] if restores else None
        after = t_restore if t_restore is not None else t_relaunch
        lines = [
            m for m in run.metrics if m["attempt"] == successor and after is not None and m["time"] >= after
        ]
        t_first = lines[0]["time"] if lines else None
        began = [e for e in run.named("run_start") if e.get("attempt") == successor and "startup_phases" in e]
        pre = max((m["step"] for m in run.metrics if m["time"] <= t0), default=0)
        regained = next(
            (m["time"] for m in run.metrics if t_first and m["time"] >= t_first and m["step"] >= pre), None
        )
        found.append(
            Incident(
                kind=fault["kind"],
                attempt=attempt,
                fault_time=t0,
                pre_fault_step=pre,
                phases_s={
                    "detect": _span(t0, t_detect),
                    "teardown": _span(t_detect, t_down),
                    "relaunch": _span(t_down, t_relaunch),
                    "restore": _span(t_relaunch, t_restore),
                    "first_step": _span(after, t_first),
                },
                mttr_s=_span(t0, t_first),
                regain_s=_span(t0, regained),
                startup_s=began[0]["startup_phases"] if began else None,
            )
        )
    return found
