"""When the job was not running: a run relaunched after it completed, and attempts that were refused.

goodput's wall clock runs from the job's first record to its last. Two things stretch it without the
job having anything to do with the time:

- A run launched again after it completed (by hand, or a scheduler's late requeue) writes a few records
  minutes or days later; counting that gap as the run's wall clock dilutes its goodput to nothing. The
  job's wall clock ends at its first completion, and the later attempts are named, not counted.
- An attempt refused before it trained (`run_refused`: a config change, a run directory in use, ...) did
  no work by design. Its own records are their own line (`refused`), and the idle gaps around it are
  `not_running`, never `requeue_wait` (which is the wait for the relaunch of a job that asked for one).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from truestep.analysis.runlog import RunLog

IDLE_KINDS = ("not_running", "refused")


@dataclass(frozen=True)
class Idle:
    end: float
    """Where the job's wall clock ends: its first completion, else its last record."""
    after_completion: list[int]
    """Attempts started after the job completed (not counted in the wall clock)."""
    refused: dict[int, tuple[float, float]]
    """Refused attempt -> (its first record, its last record), for those before `end`."""


def idle_periods(run: RunLog, trained: Iterable[int]) -> Idle:
    """`trained`: the attempts that started training (run_start)."""
    trained = set(trained)
    completions = [float(e["time"]) for e in run.named("run_end") if e.get("reason") == "completed"]
    end = min(completions) if completions else run.end_time
    times: dict[int, list[float]] = {}
    for e in run.events:
        if isinstance(e.get("attempt"), int) and e.get("source") != "supervisor":
            times.setdefault(e["attempt"], []).append(float(e["time"]))
    after = sorted(a for a, t in times.items() if min(t) > end)
    refused_attempts = {e["attempt"] for e in run.named("run_refused") if e.get("attempt") not in trained}
    refused = {a: (min(times[a]), max(times[a])) for a in sorted(refused_attempts) if a not in after}
    if not after:
        return Idle(run.end_time, after, refused)
    relaunched = min(min(times[a]) for a in after)
    records = [float(e["time"]) for e in run.events] + [float(m["time"]) for m in run.metrics]
    return Idle(max(t for t in records if t < relaunched), after, refused)


def records_before(run: RunLog, t: float) -> list[float]:
    return [float(e["time"]) for e in run.events if e["time"] < t] + [
        float(m["time"]) for m in run.metrics if m["time"] < t
    ]
