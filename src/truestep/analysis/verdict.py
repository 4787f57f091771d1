"""The one verdict: is a run the run that would have happened without the failure, and is an experiment
a pass. `fidelity`, `goodput`, `experiment`, `demo` and the report all call `judge` and
`judge_experiment` and show `label`/`head`; their exit codes are `exit_code`, so what a command returns
can never disagree with what its report says.

The verdict keeps an **evidence ledger**: every step, observable, checkpoint, final state and attempt
the verdict depends on is either compared and counted (`Evidence`) or named as missing (`Gap`). Missing,
mismatched or duplicated evidence never counts as agreement:

- a step either side lacks (the run stopped early; the reference has no line for it), a step computed
  by an attempt with another config, an observable only one line logged, a checkpoint both runs kept
  whose distances were not taken or cannot be judged, final parameters that were not compared, and
  what the run's own log declares missing (evidence_gap events: analysis/runlog.py) are gaps: the
  verdict is INCOMPLETE (exit 8), naming them;
- a step logged twice is judged on its recomputed line (analysis/runlog.py), and an earlier
  (pre-fault) line that disagrees with it is itself a finding (the resume did not reproduce the step);
- where the floor is bitwise (every repeat bit-identical to the reference, or no repeat: exact equality
  assumed), any difference is a violation; otherwise a value v at step s violates iff v > tau x E(s)
  (analysis/floor.py). A nonzero floor with fewer than 2 distinct repeats judges nothing: the verdict
  is "insufficient floor" (exit 8) unless the run is bitwise.

A violation outranks gaps (something was shown wrong); gaps outrank agreement. `scalar_rule` is the
former rule (one floor number for the whole run, times a margin), kept only so
benchmarks/detection_power.py can compare the two.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from truestep.analysis.fidelity import DEFAULT_MARGIN, LOSS, Comparison
from truestep.analysis.floor import DIGEST, FloorModel, observations, ratio
from truestep.analysis.scenario import Scenario
from truestep.core.errors import ExitCode

MISSING = "missing step"
RECOMPUTED = " (pre-fault line != recomputed)"
"""Suffix of an observable whose earlier line of a step disagreed with the line recomputed later."""


class Status(enum.StrEnum):
    BITWISE = "bitwise"
    WITHIN_FLOOR = "within floor"
    VIOLATED = "violated"
    INCOMPLETE = "incomplete"
    INSUFFICIENT_FLOOR = "insufficient floor"
    UNCHECKED = "no reference"


@dataclass(frozen=True)
class Violation:
    step: int
    observable: str
    """An observable (loss, grad_norm, lr, tokens_seen, digest, a state kind), with RECOMPUTED appended
    when the finding is a step's pre-fault line disagreeing with its recomputed one."""
    value: float
    threshold: float
    """tau x E(step); 0 where the floor is bitwise (any difference violates)."""


def steps_text(steps: tuple[int, ...] | list[int]) -> str:
    """`12`, `12-30`, or `3, 7, 12-30 (21 steps)`: runs of consecutive steps collapsed."""
    ordered = sorted(set(steps))
    spans: list[str] = []
    start = prev = None
    for s in [*ordered, None]:
        if s is not None and prev is not None and s == prev + 1:
            prev = s
            continue
        if start is not None:
            spans.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = s
    shown = ", ".join(spans[:4]) + (", ..." if len(spans) > 4 else "")
    return shown + (f" ({len(ordered)} steps)" if len(ordered) > 1 else "")


@dataclass(frozen=True)
class Gap:
    """Evidence the verdict needed and did not have."""

    what: str
    steps: tuple[int, ...] = ()
    detail: str = ""

    @property
    def text(self) -> str:
        where = f" {steps_text(self.steps)}" if self.steps else ""
        return self.what + where + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class Evidence:
    """What the verdict compared, counted."""

    steps: int
    steps_expected: int
    """Steps of the reference and of the run (their union)."""
    checkpoints: int
    checkpoints_expected: int
    """Checkpoint steps both runs kept."""
    final_parameters: bool
    """The parameters after the last step were compared (digest or state distance)."""
    final_from_logs: bool = False
    """They were compared by the digests the logs claim only: no checkpoint of that step was re-read."""
    replays: int = 0
    """Earlier (pre-fault) lines of recomputed steps compared with the recomputed line."""
    replays_not_compared: int = 0
    """Earlier lines written after the NaN guard rejected a step of their attempt: not compared."""
    observables: tuple[str, ...] = ()
    """The observables judged."""

    @property
    def text(self) -> str:
        parts = [
            f"{self.steps}/{self.steps_expected} steps",
            f"{self.checkpoints}/{self.checkpoints_expected} checkpoints",
            "final parameters NOT compared"
            if not self.final_parameters
            else "final parameters (logged digests only: no checkpoint re-read)"
            if self.final_from_logs
            else "final parameters",
        ]
        if self.replays:
            parts.append(f"{self.replays} pre-fault line{'s' if self.replays > 1 else ''} re-checked")
        if self.replays_not_compared:
            n = self.replays_not_compared
            parts.append(f"{n} line{'s' if n > 1 else ''} after a non-finite step not compared")
        return ", ".join(parts)


@dataclass(frozen=True)
class RunVerdict:
    status: Status
    violation: Violation | None = None
    first_divergent_step: int | None = None
    unverifiable_steps: int = 0
    gaps: tuple[Gap, ...] = ()
    evidence: Evidence | None = None
    floor: str = ""
    """How the floor the run was judged against was obtained (FloorModel.label)."""
    caveat: str = ""
    """What the caller accepted that the instrument would have refused (runs of another provenance),
    said in every label."""

    @property
    def preserving(self) -> bool:
        return self.status in (Status.BITWISE, Status.WITHIN_FLOOR)

    @property
    def first_violation_step(self) -> int | None:
        return self.violation.step if self.violation else None

    @property
    def first_uncounted_step(self) -> int | None:
        """The first step whose work does not count as correct: the first violation, or where the floor
        cannot judge (insufficient), the first step that is not bit-identical."""
        if self.violation is not None:
            return self.violation.step
        if self.status is Status.INSUFFICIENT_FLOOR:
            return self.first_divergent_step
        return None

    @property
    def label(self) -> str:
        """The verdict in one line, as every command and the report show it."""
        return self._label() + (f" [{self.caveat}]" if self.caveat else "")

    def _label(self) -> str:
        counted = self.evidence.text if self.evidence else ""
        if self.status is Status.VIOLATED and self.violation is not None:
            text = f"VIOLATED at step {self.violation.step} ({self.violation.observable})"
            if self.gaps:
                text += f"; also incomplete: {self.gaps[0].text}" + self._more()
            return text
        if self.status is Status.INCOMPLETE:
            return f"INCOMPLETE: {self.gaps[0].text}" + self._more()
        if self.status is Status.INSUFFICIENT_FLOOR:
            return f"insufficient floor ({self.floor}): not judged"
        if self.status in (Status.BITWISE, Status.WITHIN_FLOOR):
            return f"{self.status}: {counted}"
        return str(self.status)

    @property
    def short(self) -> str:
        """The verdict in a few words, for a plot annotation: the label without its counts and gaps."""
        if self.status is Status.VIOLATED and self.violation is not None:
            return f"VIOLATED at step {self.violation.step} ({self.violation.observable})"
        return str(self.status).upper() if self.status is Status.INCOMPLETE else str(self.status)

    def _more(self) -> str:
        return f"; {len(self.gaps) - 1} more gaps" if len(self.gaps) > 1 else ""

    @property
    def exit_code(self) -> int:
        if self.status is Status.VIOLATED:
            return int(ExitCode.FAILURE)
        if self.status in (Status.INCOMPLETE, Status.INSUFFICIENT_FLOOR):
            return int(ExitCode.INCOMPLETE)
        return int(ExitCode.OK)


UNCHECKED = RunVerdict(Status.UNCHECKED)


def _judged_checkpoints(c: Comparison, floor: FloorModel) -> set[int]:
    """Checkpoint steps whose state distances were taken and can be judged against this floor."""
    taken = {d.step for d in c.state}
    if floor.bitwise:
        return taken
    params = floor.families.get("params")
    return {s for s in taken if params is not None and params.envelope.at(s) is not None}


def _final_compared(c: Comparison, floor: FloorModel, judged_ckpts: set[int]) -> tuple[bool, bool]:
    """(the final parameters were compared, only by the digests the logs claim). A checkpoint of the
    final step re-read on both sides is the parameters themselves; a logged digest is what the logs say
    they were, and is labelled so."""
    final = c.final_step
    if final is None:
        return False, False
    if final in judged_ckpts:
        return True, False
    # Equal digests are identical parameters anywhere; a differing digest says nothing at a nonzero floor.
    by_digest = c.digests.get(final) is True or (floor.bitwise and final in c.digests)
    return by_digest, by_digest


def _unjudged_observables(c: Comparison, floor: FloorModel) -> list[Gap]:
    """Observables of the run's metrics lines the floor has no envelope for at a step (a nonzero floor
    judges each observable against its own family; one without a floor would silently pass)."""
    if floor.bitwise or floor.insufficient:
        return []
    gaps = []
    kinds = {kind for d in c.state for kind in d.totals}
    for family, values in sorted(observations(c).items()):
        if family == DIGEST or family in kinds:
            continue
        judged = floor.families.get(family)
        missing = tuple(s for s in values if judged is None or judged.envelope.at(s) is None)
        if missing:
            gaps.append(Gap(f"no floor for {family} at steps", missing, "the floor repeats did not log it"))
    return gaps


def scenario_gaps(scenario: Scenario) -> list[Gap]:
    """What a run under test did not live through of what its verdict claims (analysis/scenario.py)."""
    return [Gap(what, detail=detail) for what, detail in scenario.missing()]


def _gaps(c: Comparison, floor: FloorModel, judged_ckpts: set[int], final_ok: bool) -> list[Gap]:
    gaps = [Gap(what, steps, detail) for what, steps, detail in c.declared_gaps]
    if c.final_checkpoint_lost and c.final_step is not None:
        gaps.append(
            Gap(
                "the run's final checkpoint is gone at step",
                (c.final_step,),
                "its logs say it was committed; what they claim of the final parameters cannot be re-read",
            )
        )
    if c.missing_steps:
        gaps.append(Gap("the run never logged steps", tuple(c.missing_steps)))
    if c.unverifiable_steps:
        gaps.append(Gap("no reference line for steps", tuple(c.unverifiable_steps)))
    if c.foreign_steps:
        gaps.append(
            Gap("another config computed steps", tuple(c.foreign_steps), "; ".join(c.config_mismatch))
        )
    one_sided = sorted({name for d in c.steps for name in d.one_sided})
    if one_sided:
        steps = tuple(d.step for d in c.steps if d.one_sided)
        gaps.append(Gap(f"{', '.join(one_sided)} logged by one side only at steps", steps))
    unjudged = tuple(s for s in c.checkpoint_steps if s not in judged_ckpts and s not in c.foreign_steps)
    if unjudged:
        why = (
            "checkpoints not read (--skip-state)"
            if not c.state_read
            else "no distances taken or no floor observation (a floor repeat did not keep it)"
        )
        gaps.append(Gap("no judged state distances at checkpoint steps", unjudged, why))
    if not final_ok and c.final_step is not None and c.final_step not in c.missing_steps:
        why = (
            "no parameter digest of the run at that step, and no checkpoint of both runs read there"
            if floor.bitwise
            else "no state distance at that step (a differing digest cannot be judged at a nonzero floor)"
        )
        gaps.append(Gap("final parameters not compared at step", (c.final_step,), why))
    return gaps + _unjudged_observables(c, floor)


def _violations(c: Comparison, floor: FloorModel) -> list[Violation]:
    found = []
    for family, values in observations(c).items():
        if floor.bitwise:
            bad = next((s for s, v in sorted(values.items()) if v != 0), None)
            if bad is not None:
                found.append(Violation(bad, family, values[bad], 0.0))
            continue
        judged = floor.families.get(family)
        if judged is None or family == DIGEST:
            continue
        for step, envelope in zip(judged.envelope.steps, judged.envelope.values, strict=True):
            if step in values and ratio(values[step], envelope) > judged.tau:
                found.append(Violation(step, family, values[step], judged.tau * envelope))
                break
    return found + _replay_violations(c, floor)


def _replay_violations(c: Comparison, floor: FloorModel) -> list[Violation]:
    """A step's pre-fault line against its recomputed line: where the floor is bitwise any difference is
    a finding; otherwise the difference is judged like a run's, against tau x E at that step."""
    found = []
    for r in c.replays:
        for name in r.differs:
            value = r.deltas.get(name, math.inf)
            if floor.bitwise:
                found.append(Violation(r.step, name + RECOMPUTED, value, 0.0))
                break
            judged = floor.families.get(name)
            envelope = judged.envelope.at(r.step) if judged else None
            if judged is not None and envelope is not None and ratio(value, envelope) > judged.tau:
                found.append(Violation(r.step, name + RECOMPUTED, value, judged.tau * envelope))
                break
    if floor.bitwise:
        found += [
            Violation(s, DIGEST + RECOMPUTED, math.inf, 0.0) for s, ok in c.digest_replays.items() if not ok
        ]
    return found


def judge(c: Comparison | None, floor: FloorModel, scenario: Scenario | None = None) -> RunVerdict:
    """The verdict of one run compared with its reference (None: no reference, nothing to judge).
    `scenario`: what the run under test was meant to live through (analysis/scenario.py); what did not
    happen is a gap. None: no recovery is claimed (a floor repeat, a bare comparison)."""
    if c is None:
        return UNCHECKED
    judged_ckpts = _judged_checkpoints(c, floor)
    final_ok, from_logs = _final_compared(c, floor, judged_ckpts)
    claimed = scenario_gaps(scenario) if scenario is not None else []
    gaps = tuple(claimed + _gaps(c, floor, judged_ckpts, final_ok))
    foreign = set(c.foreign_steps)
    complete = [d for d in c.steps if not d.one_sided and d.step not in foreign]
    evidence = Evidence(
        steps=len(complete),
        steps_expected=len(c.steps) + len(c.missing_steps) + len(c.unverifiable_steps),
        checkpoints=len((judged_ckpts & set(c.checkpoint_steps)) - foreign),
        checkpoints_expected=len(c.checkpoint_steps),
        final_parameters=final_ok,
        final_from_logs=from_logs,
        replays=len(c.replays),
        replays_not_compared=len(c.replays_not_compared),
        observables=tuple(sorted(observations(c))),
    )
    common = dict(
        first_divergent_step=c.first_divergent_step,
        unverifiable_steps=len(c.unverifiable_steps),
        gaps=gaps,
        evidence=evidence,
        floor=floor.label,
        caveat=_caveat(c, floor),
    )
    if not floor.insufficient:
        found = _violations(c, floor)
        if found:
            first = min(found, key=lambda v: (v.step, RECOMPUTED in v.observable, v.observable != LOSS))
            return RunVerdict(Status.VIOLATED, first, **common)
    elif not c.bitwise:
        return RunVerdict(Status.INSUFFICIENT_FLOOR, **common)
    if gaps:
        return RunVerdict(Status.INCOMPLETE, **common)
    return RunVerdict(Status.BITWISE if c.bitwise else Status.WITHIN_FLOOR, **common)


def _caveat(c: Comparison, floor: FloorModel) -> str:
    differs = [*c.provenance, *floor.provenance]
    if not differs:
        return ""
    return f"PROVENANCE DIFFERS, compared anyway: {'; '.join(dict.fromkeys(differs))}"


def scalar_rule(c: Comparison, floor: FloorModel, margin: float = DEFAULT_MARGIN) -> int | None:
    """The former rule, for comparison only: the first step missing or with |Δloss| > margin x the
    largest |Δloss| of any floor run at any step (likewise grad norm). Ignores parameters."""
    limit_loss, limit_grad = margin * floor.max_dloss, margin * floor.max_dgrad_norm
    found = [d.step for d in c.steps if d.dloss > limit_loss or d.dgrad_norm > limit_grad][:1]
    return min(found + c.missing_steps[:1], default=None)


@dataclass(frozen=True)
class CellVerdict:
    """One ablation cell: which mechanism was off, how the job recovered, and the run's verdict."""

    row: str
    mode: str
    run: str
    verdict: RunVerdict

    @property
    def flagged(self) -> bool:
        return not self.verdict.preserving


@dataclass(frozen=True)
class ExperimentVerdict:
    head: str
    """PASS, FAIL, INCOMPLETE or NO FAULTED RUN: the report's first word."""
    failures: list[str]
    """Why it failed or is incomplete, one phrase per run or cell."""
    incomplete: list[str] = field(default_factory=list)
    """Runs and cells whose verdict is incomplete (listed also when the head is FAIL)."""

    @property
    def exit_code(self) -> int:
        if self.head == "FAIL":
            return int(ExitCode.FAILURE)
        if self.head == "INCOMPLETE":
            return int(ExitCode.INCOMPLETE)
        return int(ExitCode.OK)


COST_ROWS = frozenset({"peer-snapshots-off"})
"""Ablation rows that switch off a mechanism of cost, not of correctness (experiment/plan.py): peer
snapshots off recovers from disk instead of peers' memory, losing more steps, never the trajectory."""
MUST_PRESERVE_ROWS = frozenset({"all-on"}) | COST_ROWS
"""Ablation rows whose cells must stay trajectory-preserving: a violation there fails the experiment."""


def judge_experiment(faulted: dict[str, RunVerdict], cells: list[CellVerdict]) -> ExperimentVerdict:
    """FAIL if a faulted run or an all-on (or cost-row) ablation cell is VIOLATED; INCOMPLETE if none is
    but one of them is incomplete (or has an insufficient floor); PASS if there was something to judge
    and all of it is trajectory-preserving. A cell with a correctness mechanism off that is *not* flagged
    is no failure of the run (the switch may have had nothing to change); the report lists those."""
    judged = [(f"`{name}`", v) for name, v in faulted.items()]
    judged += [(f"{c.row} `{c.run}`", c.verdict) for c in cells if c.row in MUST_PRESERVE_ROWS]
    failures = [f"{name} {v.label}" for name, v in judged if v.status is Status.VIOLATED]
    incomplete = [
        f"{name} {v.label}" for name, v in judged if not v.preserving and v.status is not Status.VIOLATED
    ]
    if failures:
        return ExperimentVerdict("FAIL", failures, incomplete)
    if incomplete:
        return ExperimentVerdict("INCOMPLETE", incomplete, incomplete)
    return ExperimentVerdict("PASS" if judged else "NO FAULTED RUN", [], [])
