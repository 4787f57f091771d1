"""Every restore of a run, whatever it came from: a checkpoint on disk (`checkpoint_restore`) or peers'
memory (`memory_restore`, resilience.snapshot_every_steps), and what each recovery cost in steps.

The rest of the analysis asks here instead of naming one restore event, so a restore from memory counts
as a resume, opens a resume window, is the `restore` phase of its recovery and a `restore` span of the
badput, exactly like a restore from disk. An attempt's *first* restore is its recovery; a later one in
the same attempt is a NaN rollback, not a recovery.

Steps lost per failure: the restore event's `steps_lost` (the steps the failed attempts had completed
past the restored step, all recomputed); an event without it (runs made before it was logged) gets the
same number from the metrics: the newest step an earlier attempt logged, less the restored step.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from truestep.analysis.runlog import RunLog

RESTORE_EVENTS = ("checkpoint_restore", "memory_restore")
"""The events that say a rank's whole state was restored (docs/measures.md)."""
SOURCES = ("memory", "disk")


def restore_events(run: RunLog) -> list[dict[str, Any]]:
    """Every restore event of the run, in time order."""
    return [e for e in run.events if e.get("event") in RESTORE_EVENTS]


def source_of(event: dict[str, Any]) -> str:
    """`memory` or `disk`: the event's `source`, else what its name says (older runs logged none)."""
    source = event.get("source")
    if source in SOURCES:
        return str(source)
    return "memory" if event.get("event") == "memory_restore" else "disk"


@dataclass(frozen=True)
class Recovery:
    """One attempt's first restore: where the run came back from after whatever stopped the attempt
    before it."""

    attempt: int | None
    time: float
    step: int
    source: str
    """memory or disk."""
    restore_s: float | None
    """The restore itself (the event's `restore_s`; a memory restore's includes its SHA-256 checks)."""
    steps_lost: int | None
    """Steps completed past `step` by earlier attempts, recomputed by this one (None: not known)."""


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None


def lost_before(run: RunLog, attempt: int | None, step: int) -> int | None:
    """Steps earlier attempts than `attempt` logged past `step` (None: no earlier step, or no attempt)."""
    if attempt is None:
        return None
    before = [m["step"] for m in run.metrics if m["attempt"] < attempt]
    return max(0, max(before) - step) if before else None


def recovery_of(run: RunLog, event: dict[str, Any]) -> Recovery:
    attempt, step = event.get("attempt"), int(event.get("step") or 0)
    lost = event.get("steps_lost")
    known = isinstance(lost, int) and not isinstance(lost, bool) and lost >= 0
    return Recovery(
        attempt=attempt,
        time=float(event["time"]),
        step=step,
        source=source_of(event),
        restore_s=_number(event.get("restore_s")),
        steps_lost=int(lost) if known else lost_before(run, attempt, step),
    )


def recoveries(run: RunLog) -> list[Recovery]:
    """Each attempt's first restore, in time order (a later one in the same attempt is a rollback)."""
    seen: set[Any] = set()
    found = []
    for event in restore_events(run):
        if event.get("attempt") in seen:
            continue
        seen.add(event.get("attempt"))
        found.append(recovery_of(run, event))
    return found


def incident_fields(run: RunLog, attempt: int | None) -> dict[str, Any]:
    """What the attempt that took over after an incident restored (analysis/mttr.py's Incident fields):
    the source, the restore's own seconds and the steps lost; a fresh start restored nothing and lost
    every step logged before it; no such attempt: nothing known."""
    first = next(
        (e for e in restore_events(run) if attempt is not None and e.get("attempt") == attempt), None
    )
    if first is None:
        return {"restore_source": None, "restore_s": None, "steps_lost": lost_before(run, attempt, 0)}
    got = recovery_of(run, first)
    return {"restore_source": got.source, "restore_s": got.restore_s, "steps_lost": got.steps_lost}


@dataclass(frozen=True)
class StepsLost:
    """Steps lost per recovery of a run, and where each recovery came from (the same order)."""

    per_recovery: list[int | None] = field(default_factory=list)
    """Each recovery's steps lost (None: not known), in time order."""
    sources: list[str] = field(default_factory=list)
    """Each recovery's source: memory or disk."""

    @property
    def known(self) -> list[int]:
        return [n for n in self.per_recovery if n is not None]

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.known) if self.known else None

    @property
    def most(self) -> int | None:
        return max(self.known) if self.known else None

    def by_source(self) -> dict[str, int]:
        """memory / disk -> how many recoveries came from there (a source that served none left out)."""
        return {s: self.sources.count(s) for s in SOURCES if s in self.sources}


def steps_lost(run: RunLog) -> StepsLost:
    found = recoveries(run)
    return StepsLost([r.steps_lost for r in found], [r.source for r in found])
