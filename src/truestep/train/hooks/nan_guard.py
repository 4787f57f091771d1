"""The NaN guard hook: log every skipped (non-finite) step; roll back when the policy says so."""

from __future__ import annotations

from typing import TYPE_CHECKING

from truestep.resilience.nan_guard import NanGuard
from truestep.train.hooks.base import Hook
from truestep.train.hooks.checkpointing import CheckpointHook

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer


class NanGuardHook(Hook):
    def __init__(self, checkpoints: CheckpointHook) -> None:
        self.checkpoints = checkpoints
        self.guard: NanGuard | None = None

    def on_start(self, trainer: Trainer) -> None:
        self.guard = NanGuard(trainer.cfg.resilience.nan_rollback_after)

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        assert self.guard is not None
        roll_back = self.guard.observe(result.skipped)
        if not result.skipped:
            return
        trainer.logs.event(
            "nonfinite_step_skipped",
            step=trainer.state.step,
            loss=result.loss,
            grad_norm=result.grad_norm,
            consecutive=self.guard.consecutive,
        )
        if roll_back:
            after = self.guard.consecutive
            step = self.checkpoints.rollback(trainer)
            self.guard.rolled_back(step)
            trainer.logs.event("nan_rollback", to_step=step, after_consecutive=after)
