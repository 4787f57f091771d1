"""The collective-timeout hook: the short timeout from the first completed step on, the start-up budget
again for the final save and teardown."""

from __future__ import annotations

from typing import TYPE_CHECKING

from truestep.resilience.timeouts import set_collective_timeout
from truestep.train.hooks.base import Hook, Slot

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult
    from truestep.train.view import StepView


class CollectiveTimeoutHook(Hook):
    slot = Slot.TIMEOUTS

    def __init__(self) -> None:
        self.shortened = False

    def after_step(self, view: StepView, result: StepResult) -> None:
        if not self.shortened:
            seconds = view.cfg.resilience.collective_timeout_s
            set_collective_timeout(view.ctx, seconds)
            self.shortened = True
            view.logs.event("collective_timeout_set", seconds=seconds)

    def on_end(self, view: StepView) -> None:
        # The final save and teardown may take longer than a step: give them the start-up budget.
        if self.shortened:
            set_collective_timeout(view.ctx, view.cfg.parallel.init_timeout_s)
