"""The NaN guard hook: log every skipped (non-finite) step; ask the loop to roll back when the policy says
so (the loop performs the rollback once every hook has seen the step, train/loop.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from truestep.resilience.nan_guard import NanGuard
from truestep.train.hooks.base import Hook, Slot

if TYPE_CHECKING:
    from truestep.checkpoint.restored import Restored
    from truestep.train.restorer import Start
    from truestep.train.trainer import StepResult
    from truestep.train.view import StepView


class NanGuardHook(Hook):
    slot = Slot.NAN_GUARD

    def __init__(self) -> None:
        self.guard: NanGuard | None = None
        self.rolling_back_after = 0

    def on_start(self, view: StepView, start: Start) -> None:
        self.guard = NanGuard(view.cfg.resilience.nan_rollback_after)

    def after_step(self, view: StepView, result: StepResult) -> None:
        assert self.guard is not None
        roll_back = self.guard.observe(result.skipped)
        if not result.skipped:
            return
        view.logs.event(
            "nonfinite_step_skipped",
            step=view.step,
            loss=result.loss,
            grad_norm=result.grad_norm,
            consecutive=self.guard.consecutive,
        )
        if roll_back:
            self.rolling_back_after = self.guard.consecutive
            view.request_rollback()

    def on_rollback(self, view: StepView, restored: Restored) -> None:
        assert self.guard is not None
        self.guard.rolled_back(restored.step)
        view.logs.event("nan_rollback", to_step=restored.step, after_consecutive=self.rolling_back_after)
