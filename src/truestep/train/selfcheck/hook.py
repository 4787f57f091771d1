"""The resume self-check in the loop: the one hook that receives what the restore did (the `Restored` in
the loop's `Start`) and judges the resume with every piece of evidence that applies, in one verdict.

Evidence (evidence.py, witness.py): the restore's own digest finding, the replay of the steps the fault
lost, the stop witness of a graceful stop. Each runs its collective part on every rank; rank 0 compares
and every rank learns, as a bool, whether a step flags the resume, so `on_resume_divergence = "stop"`
stops every rank at the same step, before the checkpoint hook could save it (this hook's slot is first).
The verdict is the judge's (judge.py): one `resume_verified` / `resume_unverified` / `resume_diverged`
event per resume, one console line, `resume/self_check` in TensorBoard (1, 0, -1).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from truestep.checkpoint.errors import ResumeError
from truestep.checkpoint.restored import Restored
from truestep.telemetry.tensorboard import ScalarSinks
from truestep.train.hooks.base import Hook, Slot
from truestep.train.selfcheck.evidence import DigestEvidence, Evidence, ReplayEvidence
from truestep.train.selfcheck.judge import judge
from truestep.train.selfcheck.replay import Verdict
from truestep.train.selfcheck.witness import WitnessEvidence

if TYPE_CHECKING:
    from truestep.train.restorer import Start
    from truestep.train.trainer import StepResult
    from truestep.train.view import StepView

TB_VALUE = {Verdict.VERIFIED: 1.0, Verdict.UNVERIFIED: 0.0, Verdict.DIVERGED: -1.0}
"""`resume/self_check` in TensorBoard: 1 verified, 0 unverified, -1 diverged."""


class ResumeDivergedError(ResumeError):
    """The resume differs from its evidence and resilience.on_resume_divergence = "stop"."""


class SelfCheckHook(Hook):
    slot = Slot.SELF_CHECK

    def __init__(self, sinks: ScalarSinks) -> None:
        self.sinks = sinks
        self.restored: Restored | None = None
        self.evidence: list[Evidence] = []
        self.finished = True

    def on_start(self, view: StepView, start: Start) -> None:
        if start.restored is None or not view.cfg.resilience.resume_check:
            return
        self.restored = start.restored
        self.evidence = [DigestEvidence(), WitnessEvidence(), ReplayEvidence()]
        for evidence in self.evidence:
            evidence.on_start(view, start.restored)
        self.finished = False
        self.sinks.open(view.step)

    def after_step(self, view: StepView, result: StepResult) -> None:
        if self.finished:
            return
        flagged = False
        for evidence in self.evidence:  # every rank calls each one: their collectives line up
            flagged = evidence.after_step(view, result) or flagged
        if flagged or all(e.done for e in self.evidence):
            self._finish(view)
            # Every rank knows what rank 0's judge decides: a flag it shares, in the config it shares.
            diverged = flagged and not self.restored.config_differences  # type: ignore[union-attr]
            if diverged and view.cfg.resilience.on_resume_divergence == "stop":
                raise ResumeDivergedError(
                    f"the resume diverged at step {view.step} "
                    '(resilience.on_resume_divergence = "stop"): see the resume_diverged event'
                )

    def on_end(self, view: StepView) -> None:
        # The run ended inside the window (a lower max_steps, a stop): judge what was compared.
        if not self.finished:
            self._finish(view)

    def _finish(self, view: StepView) -> None:
        """Rank 0 judges, logs and says the verdict; the other ranks only stop looking."""
        self.finished = True
        restored = self.restored
        assert restored is not None
        if not view.ctx.is_main:
            return
        seen = [s for s in (e.seen() for e in self.evidence) if s is not None]
        verdict = judge(restored, seen)
        view.logs.event(f"resume_{verdict.verdict}", **verdict.facts)
        print(f"truestep train: {verdict.line}", file=sys.stderr, flush=True)
        self.sinks.scalars(view.step, {"resume/self_check": TB_VALUE[verdict.verdict]})
