"""No claim without its scenario: what a run under test was meant to live through, and what happened.

A verdict about recovery ("after 2 injected faults and 2 resumes, bitwise equal") is evidence only if the
faults fired and the run resumed. Read from the run's own events:

- **named faults**: every spec an attempt was armed with (`run_start.faults`), and those the caller
  declares (an experiment's job faults: a run that lost its run_start still named them);
- **fired**: the specs of `fault_injected` events (`slow` never announces itself, so it is not required);
- **restarts**: attempts after the first that logged a `run_start`, with the step each started at
  (`run_start.start_step`; None where it logged none: an audited attempt that logged no step);
  **restored**: attempts that logged a restore, from disk (`checkpoint_restore`) or from peers' memory
  (`memory_restore`): a resume, or a NaN rollback inside an attempt (analysis/restores.py).

What did not happen becomes a gap of the verdict (INCOMPLETE, exit 8, naming it): a named fault that
never fired, a run that never resumed (from a checkpoint or from memory), a restart that started over instead of
restoring. This rule alone owns "a restart did not resume", for truestep's runs and audited ones alike
(`truestep audit` records each attempt's start and its inferred resumes, and leaves the judgement here),
so one cause is one gap. A run under test that is failure-free altogether (nothing fired, nothing restored, one
attempt) is refused where the caller asked about one run (`truestep fidelity`), and incomplete in an
experiment (analysis/summary.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from truestep.analysis.restores import restore_events
from truestep.analysis.runlog import RunLog

SILENT_KINDS = ("slow",)
"""Fault kinds that act on every step and never log a `fault_injected` (faults/hooks.py)."""


def _norm(spec: str) -> str:
    return "".join(str(spec).split())


@dataclass(frozen=True)
class Scenario:
    named: tuple[str, ...]
    """Fault specs the run was armed with or declared to have (whitespace removed)."""
    fired: tuple[str, ...]
    """Specs of the faults that fired (each once)."""
    restarts: tuple[int, ...]
    """Attempts after the first that started (logged a run_start)."""
    restored: tuple[int, ...]
    """Attempts that restored a checkpoint."""
    starts: tuple[tuple[int, int | None], ...] = ()
    """(attempt, the step its run_start says it started at, None where it logged none) of each restart."""

    @property
    def unfired(self) -> list[str]:
        return [s for s in self.named if s not in self.fired and s.split(":", 1)[0] not in SILENT_KINDS]

    @property
    def unrestored(self) -> list[int]:
        """Restarts that did not restore a checkpoint (started over from step 0)."""
        return [a for a in self.restarts if a not in self.restored]

    @property
    def failure_free(self) -> bool:
        return not self.fired and not self.restored and not self.restarts

    def _how_started(self, attempts: list[int]) -> str:
        at = dict(self.starts)
        said = []
        for a in attempts:
            step = at.get(a)
            said.append(
                f"attempt {a} logged no step" if step is None else f"attempt {a} started at step {step}"
            )
        return "; ".join(said)

    def missing(self) -> list[tuple[str, str]]:
        """(what did not happen, detail) for each part of the scenario that is not in the logs."""
        out = []
        if self.unfired:
            out.append(("named faults never fired", "; ".join(self.unfired)))
        if not self.restored:
            out.append(
                (
                    "the run never resumed from a checkpoint",
                    f"{len(self.fired)} fault(s) fired, {len(self.restarts)} restart(s), no checkpoint_restore "
                    "or memory_restore: nothing about recovery to judge"
                    + (f" ({self._how_started(list(self.restarts))})" if self.restarts else ""),
                )
            )
        elif self.unrestored:
            out.append(("restarted without restoring a checkpoint", self._how_started(self.unrestored)))
        return out

    @property
    def text(self) -> str:
        return (
            f"{len(self.fired)}/{len(self.named)} named faults fired, {len(self.restored)} of "
            f"{len(self.restarts)} restarts restored"
        )


def scenario(run: RunLog, declared: list[str] | tuple[str, ...] = ()) -> Scenario:
    """What `run` was meant to live through and what its events say happened."""
    named = [_norm(s) for e in run.named("run_start") for s in (e.get("faults") or [])]
    named += [_norm(s) for s in declared]
    fired = [_norm(e.get("spec", "")) for e in run.named("fault_injected")]
    started: dict[int, int | None] = {}
    for e in run.named("run_start"):
        step = e.get("start_step")
        number = step if isinstance(step, int) and not isinstance(step, bool) else None
        started.setdefault(int(e.get("attempt") or 0), number)
    attempts = sorted(started)
    restored = sorted({int(e.get("attempt") or 0) for e in restore_events(run)})
    return Scenario(
        tuple(dict.fromkeys(s for s in named if s)),
        tuple(dict.fromkeys(s for s in fired if s)),
        tuple(attempts[1:]),
        tuple(restored),
        tuple((a, started[a]) for a in attempts[1:]),
    )
