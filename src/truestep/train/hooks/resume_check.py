"""The resume self-check (resilience/replay.py) in the loop: after a restore from step s, every recomputed
step s+1..f is compared with the line the run logged for it before the fault.

Rank 0 reads the pre-fault lines and judges; every other rank learns the window's length and each step's
verdict through one integer broadcast (only while replaying), so `on_resume_divergence = "stop"` stops
every rank at the same step. The hook runs first in after_step, so a diverged trajectory is stopped
before the checkpoint hook could save it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from truestep.checkpoint.errors import ResumeError
from truestep.core.names import METRICS_FILE
from truestep.parallel.dist import broadcast_int
from truestep.resilience.replay import Mismatch, ReplayCheck, Verdict, prefault_window
from truestep.telemetry.jsonl import iter_jsonl
from truestep.train.hooks.base import Hook
from truestep.train.hooks.metrics import MetricsHook, step_fields
from truestep.train.restored_digest import DIFFERS_KEPT

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer

UNREADABLE = -1
"""Broadcast window length meaning: rank 0 could not read the pre-fault lines."""
RESTORED_OTHER_WEIGHTS = -2
"""Broadcast window length meaning: the restore kept weights that are not the saved ones (naive ablation)."""
TB_VALUE = {Verdict.VERIFIED: 1.0, Verdict.UNVERIFIED: 0.0, Verdict.DIVERGED: -1.0}
"""`resume/self_check` in TensorBoard: 1 verified, 0 unverified, -1 diverged."""


class ResumeDivergedError(ResumeError):
    """The replayed steps differ from the pre-fault ones and resilience.on_resume_divergence = "stop"."""


def say(line: str) -> None:
    """The self-check's one console line (rank 0 only; callers check)."""
    print(f"truestep train: {line}", file=sys.stderr, flush=True)


def bitwise_platform(trainer: Trainer, layout_changed: bool) -> bool:
    """Whether a replayed step must be bit-identical: deterministic algorithms on CPU, no emulated
    reduction noise, and the layout of the saving run (another layout reduces in another order)."""
    t = trainer.cfg.train
    return (
        t.deterministic
        and trainer.ctx.device.type == "cpu"
        and not t.emulate_nondeterminism
        and not layout_changed
    )


class ResumeCheckHook(Hook):
    def __init__(
        self,
        metrics: MetricsHook,
        layout_changed: Callable[[], bool] = lambda: False,
        witnessed: Callable[[], bool] = lambda: False,
        restored_digest: Callable[[], str] = lambda: "",
    ) -> None:
        self.metrics = metrics
        self.layout_changed = layout_changed
        self.witnessed = witnessed
        """A stop witness judges this resume (train/hooks/witness.py): nothing replayed is not news."""
        self.restored_digest = restored_digest
        """The restore's digest verdict (train/restored_digest.py); DIFFERS_KEPT flags the resume at once."""
        self.check: ReplayCheck | None = None
        self.window_len = 0
        self.first_step = 0
        self.started = False
        self.finished = False

    def _begin(self, trainer: Trainer, restored_step: int) -> None:
        """Collective, at the first step after a restore: rank 0 reads the window, every rank its length."""
        cfg = trainer.cfg.resilience
        length, reason = 0, ""
        self.first_step = restored_step + 1
        if trainer.ctx.is_main:
            try:
                lines = iter_jsonl(trainer.run_dir / METRICS_FILE)
                window = prefault_window(lines, restored_step, trainer.logs.attempt)
            except (OSError, UnicodeDecodeError, ValueError) as err:
                window, reason = {}, f"cannot read the pre-fault lines: {err}"
            bitwise = bitwise_platform(trainer, bool(self.layout_changed()))
            self.check = ReplayCheck(restored_step, window, bitwise, cfg.resume_check_floor)
            if self.restored_digest() == DIFFERS_KEPT:  # the naive ablation restored other weights
                self.check.mismatch = Mismatch(
                    self.first_step,
                    ("param_digest",),
                    {},
                    {},
                    "the restored weights: they are not the ones saved (checkpoint.atomic_commit=false)",
                )
            if reason:
                length = UNREADABLE
            elif self.check.mismatch is not None:
                length = RESTORED_OTHER_WEIGHTS
            else:
                length = len(window)
        self.window_len = broadcast_int(length, trainer.ctx)
        if self.window_len <= 0:
            self._finish(trainer, reason)
        if self.window_len == RESTORED_OTHER_WEIGHTS:
            self._stop_if_asked(trainer, self.first_step)

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        if self.finished:
            return
        step = trainer.state.step
        if not self.started:
            self.started = True
            # A restore happened in this attempt (load_rank_state counts attempts): step s+1 just ran.
            if not trainer.cfg.resilience.resume_check or trainer.state.attempts <= 1:
                self.finished = True
                return
            self._begin(trainer, step - 1)
            if self.finished:
                return
        flagged = 0
        if self.check is not None and self.check.pending(step):
            flagged = int(self.check.compare(step, step_fields(trainer, result)) is not None)
        flagged = broadcast_int(flagged, trainer.ctx)
        last = step >= self.first_step + self.window_len - 1
        if flagged or last:
            self._finish(trainer, "")
            if flagged:
                self._stop_if_asked(trainer, step)

    def _stop_if_asked(self, trainer: Trainer, step: int) -> None:
        if trainer.cfg.resilience.on_resume_divergence == "stop":
            raise ResumeDivergedError(
                f"the resume diverged from the pre-fault trajectory at step {step} "
                '(resilience.on_resume_divergence = "stop"): see the resume_diverged event'
            )

    def on_end(self, trainer: Trainer) -> None:
        # The run ended inside the window (a lower max_steps, a stop): judge what was compared.
        if self.started and not self.finished:
            self._finish(trainer, "")

    def _finish(self, trainer: Trainer, reason: str) -> None:
        self.finished = True
        check = self.check
        if check is None:  # not rank 0: rank 0 logs and prints
            return
        verdict, _ = check.verdict()
        if check.compared == 0 and not reason and self.witnessed():
            return
        facts = check.facts()
        if reason:
            facts["reason"] = reason
        trainer.logs.event(f"resume_{verdict}", **facts)
        line = check.summary()
        if reason:
            line = f"resume unverified: {reason}"
        say(line)
        tb = self.metrics.tensorboard
        if tb is not None:
            tb.scalar("resume/self_check", TB_VALUE[verdict], trainer.state.step)
