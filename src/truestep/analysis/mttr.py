"""MTTR per incident: fault -> detected -> all ranks down -> relaunched -> restored -> first new step, and
the time to regain the step the run had reached before the fault. All from event timestamps. The
restore is from disk or from peers' memory (analysis/restores.py): each incident says which, how long the
restore itself took within its phase, and how many steps it lost.

An incident is anything the job had to recover from, whether or not anyone injected it:
- an injected fault (`fault_injected`): its time is the fault's;
- a failure the supervisor detected (`failure_detected`) that no injected fault explains -- in
  production every failure is one of these: one incident per failed attempt (every node's supervisor
  may record the same failure), from the rank's last sign of health the supervisor recorded
  (`failure_detected.last_seen`: detection took at most that long) or, without it, from the detection
  (its detect phase unknown);
- an attempt that stopped without a detected failure and was started again (`relaunch`): a
  preemption or a signal to a rank (`preempted`, from the first signal seen), or a job that vanished
  without a word (`lost`, from its last record: when it died is not known).

Events are joined by attempt number (job-wide, docs/resilience.md), not by "the next event of that name":
the fault's attempt is the one that went down, the next attempt is the one that recovered. So a `term`
whose attempt then crashed in its emergency save is down when the supervisor tore it down (there is no
`run_end` of that attempt), and a NaN rollback later in the recovering attempt is not its restore.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from truestep.analysis.goodput import attempt_at, attempt_starts
from truestep.analysis.restores import incident_fields, restore_events
from truestep.analysis.runlog import RunLog

PROCESS_FAULTS = ("kill", "hang", "crash", "crash-in-save", "corrupt", "term")
PHASES = ("detect", "teardown", "relaunch", "restore", "first_step")
ORIGINS = ("injected", "detected", "relaunch")


@dataclass(frozen=True)
class Incident:
    kind: str
    """The injected fault's kind, the detected failure's (process_exit, stale_heartbeat, ...), or for a
    relaunch `preempted` or `lost`."""
    attempt: int | None
    fault_time: float
    """When it began: the injected fault's time, a detected failure's `last_seen` (else its detection),
    a relaunch's first signal (else the stopped attempt's last record)."""
    pre_fault_step: int
    phases_s: dict[str, float | None]
    """detect, teardown, relaunch, restore (relaunch -> state restored; None when the fault came before the
    first checkpoint), first_step (None where the run never got there). detect is None where the moment
    of the failure is not known (no `last_seen`, a job that vanished)."""
    mttr_s: float | None
    """fault -> first new step."""
    regain_s: float | None
    """fault -> the pre-fault step is reached again."""
    origin: str = "injected"
    """injected, detected or relaunch (module docstring)."""
    restore_source: str | None = None
    """Where the attempt that took over restored from: memory or disk (None: a fresh start, or none)."""
    restore_s: float | None = None
    """Of the `restore` phase, the restore itself (its event's `restore_s`); the rest is start-up."""
    steps_lost: int | None = None
    """Steps completed before the incident and recomputed after it (the restore event's `steps_lost`; a
    fresh start lost every step; None: not known)."""
    startup_s: dict[str, float] | None = None
    """Where the recovering attempt's own start-up went (its `run_start.startup_phases`: import, build,
    init, verify, load seconds on rank 0); None where it never logged one."""


@dataclass(frozen=True)
class _Onset:
    kind: str
    attempt: int | None
    time: float
    detected: float | None
    """When it was detected, where that ends a known span from `time` (else None: detect unknown)."""
    down: float | None
    origin: str
    torn_down_from: float | None
    """Where the teardown phase starts (the detection, also where its own delay is unknown)."""


def _first(events: list[dict[str, Any]], after: float | None, key: str = "time") -> float | None:
    if after is None:
        return None
    later = [e.get(key, e["time"]) for e in events if e.get(key, e["time"]) >= after]
    return min(later) if later else None


def _span(a: float | None, b: float | None) -> float | None:
    return b - a if a is not None and b is not None else None


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


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


def _injected(run: RunLog, starts: dict[int, float]) -> list[_Onset]:
    found = []
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
        down = _down(run, fault, attempt, t_detect)
        found.append(_Onset(fault["kind"], attempt, t0, t_detect, down, "injected", t_detect))
    return found


def _detected(run: RunLog, starts: dict[int, float], injected: list[_Onset]) -> list[_Onset]:
    """The first failure the supervisor detected in each attempt that no injected fault explains."""
    firsts: dict[int | None, dict[str, Any]] = {}
    for failure in run.named("failure_detected"):
        at = _number(failure.get("detected_at")) or failure["time"]
        attempt = failure.get("attempt", attempt_at(starts, at))
        held = firsts.get(attempt)
        if held is None or at < (_number(held.get("detected_at")) or held["time"]):
            firsts[attempt] = failure
    found = []
    for attempt, failure in firsts.items():
        at = _number(failure.get("detected_at")) or failure["time"]
        if any(o.attempt == attempt and o.time <= at for o in injected):
            continue
        seen = _number(failure.get("last_seen"))
        t0 = seen if seen is not None and seen <= at else at
        teardowns = [e for e in run.named("teardown_complete") if e.get("attempt", attempt) == attempt]
        kind = str(failure.get("kind") or "failure")
        detected = at if seen is not None else None
        found.append(_Onset(kind, attempt, t0, detected, _first(teardowns, at), "detected", at))
    return found


def _attempt_records(run: RunLog, attempt: int) -> list[float]:
    return [e["time"] for e in run.events if e.get("attempt") == attempt] + [
        m["time"] for m in run.attempt_metrics(attempt)
    ]


def _relaunches(
    run: RunLog, starts: dict[int, float], launches: dict[int, float], explained: set[int | None]
) -> list[_Onset]:
    """Attempts that trained, stopped without a detected failure or an injected fault, and were
    followed by another: the job was preempted (or a rank signalled) or vanished, and started again."""
    completed = {e.get("attempt") for e in run.named("run_end") if e.get("reason") == "completed"}
    began = {a: min(t for t in (starts.get(a), launches.get(a)) if t is not None) for a in starts}
    ordered = sorted(set(starts) | set(launches))
    found = []
    for a, b in zip(ordered, ordered[1:], strict=False):
        if a not in starts or a in explained or a in completed:
            continue
        until = launches.get(b, starts.get(b, math.inf))
        signals = [e["time"] for e in run.named("signal_received") if e.get("attempt") == a]
        signals += [e["time"] for e in run.named("supervisor_signal") if began[a] <= e["time"] < until]
        records = [t for t in _attempt_records(run, a) if t < until]
        last = max(records, default=began[a])
        if signals:
            t0 = min(signals)
            agreed = [e for e in run.named("signal_received") if e.get("attempt") == a]
            ends = [e for e in run.named("run_end") if e.get("attempt") == a]
            down = _first(ends, t0) or _first(run.named("teardown_complete"), t0) or last
            agreed_at = _first(agreed, t0) or t0
            found.append(_Onset("preempted", a, t0, agreed_at, down, "relaunch", agreed_at))
        else:  # nothing said why: the moment it died is not known, only its last sign of life
            found.append(_Onset("lost", a, last, None, last, "relaunch", None))
    return found


def _recovery(run: RunLog, onset: _Onset, starts: dict[int, float], launches: dict[int, float]) -> Incident:
    t0, t_detect, t_down, attempt = onset.time, onset.detected, onset.down, onset.attempt
    # The attempt that took over: the first one after the onset's, launched once it was down.
    later = sorted(a for a in set(starts) | set(launches) if attempt is None or a > attempt)
    successor = next(
        (a for a in later if t_down is not None and launches.get(a, starts.get(a, -1)) >= t_down), None
    )
    t_relaunch = launches.get(successor, starts.get(successor)) if successor is not None else None
    restores = [e for e in restore_events(run) if e.get("attempt") == successor]
    t_restore = restores[0]["time"] if restores else None
    after = t_restore if t_restore is not None else t_relaunch
    lines = [m for m in run.metrics if m["attempt"] == successor and after is not None and m["time"] >= after]
    t_first = lines[0]["time"] if lines else None
    its_starts = [
        e for e in run.named("run_start") if e.get("attempt") == successor and "startup_phases" in e
    ]
    pre = max((m["step"] for m in run.metrics if m["time"] <= t0), default=0)
    regained = next(
        (m["time"] for m in run.metrics if t_first and m["time"] >= t_first and m["step"] >= pre), None
    )
    return Incident(
        kind=onset.kind,
        attempt=attempt,
        fault_time=t0,
        pre_fault_step=pre,
        phases_s={
            "detect": _span(t0, t_detect),
            "teardown": _span(onset.torn_down_from, t_down),
            "relaunch": _span(t_down, t_relaunch),
            "restore": _span(t_relaunch, t_restore),
            "first_step": _span(after, t_first),
        },
        mttr_s=_span(t0, t_first),
        regain_s=_span(t0, regained),
        origin=onset.origin,
        **incident_fields(run, successor),
        startup_s=its_starts[0]["startup_phases"] if its_starts and successor is not None else None,
    )


def incidents(run: RunLog) -> list[Incident]:
    """Every incident of the run (module docstring), in the order they began."""
    starts = attempt_starts(run)
    launches: dict[int, float] = {}
    for e in run.named("attempt_start"):
        if "attempt" in e:
            launches.setdefault(e["attempt"], e["time"])
    injected = _injected(run, starts)
    detected = _detected(run, starts, injected)
    explained = {o.attempt for o in injected + detected}
    onsets = injected + detected + _relaunches(run, starts, launches, explained)
    return [_recovery(run, o, starts, launches) for o in sorted(onsets, key=lambda o: o.time)]
