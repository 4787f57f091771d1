"""The one verdict: is a run the run that would have happened without the failure, and is an experiment
a pass. `fidelity`, `goodput`, `experiment`, `demo` and the report all call `judge` and
`judge_experiment` and show `label`/`head`; their exit codes are `exit_code`, so what a command returns
can never disagree with what its report says.

A run is judged observable by observable against the floor (analysis/floor.py):
- a step of the reference that the run lacks is a violation (INCOMPLETE);
- where the floor is bitwise (every repeat bit-identical to the reference, or no repeat: exact equality
  assumed), any nonzero |Δloss|, |Δgrad norm| or state distance and any differing parameter digest is a
  violation;
- otherwise a value v at step s violates iff v > tau x E(s) (the family's envelope and calibrated
  multiplier), judged where the floor has an observation.
The first violation (earliest step) is the verdict's; steps past the reference's are reported as
unverifiable and never counted as correct. `scalar_rule` is the former rule (one floor number for the
whole run, times a margin), kept only so benchmarks/detection_power.py can compare the two.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from truestep.analysis.fidelity import DEFAULT_MARGIN, Comparison
from truestep.analysis.floor import LOSS, FloorModel, observations, ratio
from truestep.core.errors import ExitCode

MISSING = "missing step"


class Status(enum.StrEnum):
    BITWISE = "bitwise"
    WITHIN_FLOOR = "within floor"
    VIOLATED = "violated"
    INCOMPLETE = "incomplete"
    UNCHECKED = "no reference"


@dataclass(frozen=True)
class Violation:
    step: int
    observable: str
    """loss, grad_norm, digest, a state kind (params, exp_avg, exp_avg_sq, step) or `missing step`."""
    value: float
    threshold: float
    """tau x E(step); 0 where the floor is bitwise (any difference violates)."""


@dataclass(frozen=True)
class RunVerdict:
    status: Status
    violation: Violation | None = None
    first_divergent_step: int | None = None
    unverifiable_steps: int = 0

    @property
    def preserving(self) -> bool:
        return self.status in (Status.BITWISE, Status.WITHIN_FLOOR)

    @property
    def first_violation_step(self) -> int | None:
        return self.violation.step if self.violation else None

    @property
    def label(self) -> str:
        """The verdict in a word or phrase, as every command and the report show it."""
        if self.status is Status.VIOLATED and self.violation is not None:
            text = f"VIOLATED at step {self.violation.step} ({self.violation.observable})"
        elif self.status is Status.INCOMPLETE and self.violation is not None:
            text = f"INCOMPLETE from step {self.violation.step}"
        else:
            text = str(self.status)
        if self.unverifiable_steps:
            text += f", {self.unverifiable_steps} steps unverifiable"
        return text

    @property
    def exit_code(self) -> int:
        return (
            int(ExitCode.FAILURE) if self.status in (Status.VIOLATED, Status.INCOMPLETE) else int(ExitCode.OK)
        )


UNCHECKED = RunVerdict(Status.UNCHECKED)


def _violations(c: Comparison, floor: FloorModel) -> list[Violation]:
    found = [Violation(s, MISSING, math.inf, 0.0) for s in c.missing_steps[:1]]
    for family, values in observations(c).items():
        if floor.bitwise:
            bad = next((s for s, v in sorted(values.items()) if v != 0), None)
            if bad is not None:
                found.append(Violation(bad, family, values[bad], 0.0))
            continue
        judged = floor.families.get(family)
        if judged is None:
            continue
        for step, envelope in zip(judged.envelope.steps, judged.envelope.values, strict=True):
            if step in values and ratio(values[step], envelope) > judged.tau:
                found.append(Violation(step, family, values[step], judged.tau * envelope))
                break
    return found


def judge(c: Comparison | None, floor: FloorModel) -> RunVerdict:
    """The verdict of one run compared with its reference (None: no reference, nothing to judge)."""
    if c is None:
        return UNCHECKED
    found = _violations(c, floor)
    unverifiable = len(c.unverifiable_steps)
    if found:
        first = min(found, key=lambda v: (v.step, v.observable != MISSING, v.observable != LOSS))
        status = Status.INCOMPLETE if first.observable == MISSING else Status.VIOLATED
        return RunVerdict(status, first, c.first_divergent_step, unverifiable)
    status = Status.BITWISE if c.bitwise else Status.WITHIN_FLOOR
    return RunVerdict(status, None, c.first_divergent_step, unverifiable)


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
    """PASS, FAIL or NO FAULTED RUN: the report's first word."""
    failures: list[str]
    """Why it failed, one phrase per failing run or cell."""

    @property
    def exit_code(self) -> int:
        return int(ExitCode.FAILURE) if self.head == "FAIL" else int(ExitCode.OK)


def judge_experiment(faulted: dict[str, RunVerdict], cells: list[CellVerdict]) -> ExperimentVerdict:
    """FAIL if a faulted run is not trajectory-preserving or an all-on ablation cell is flagged; PASS if
    there was something to judge and nothing failed. A cell with a mechanism off that is *not* flagged
    is no failure of the run (the switch may have had nothing to change); the report lists those."""
    failures = [f"`{name}` {v.label}" for name, v in faulted.items() if not v.preserving]
    failures += [f"all-on `{c.run}` {c.verdict.label}" for c in cells if c.row == "all-on" and c.flagged]
    if failures:
        return ExperimentVerdict("FAIL", failures)
    judged = bool(faulted) or any(c.row == "all-on" for c in cells)
    return ExperimentVerdict("PASS" if judged else "NO FAULTED RUN", [])
