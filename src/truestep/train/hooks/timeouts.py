"""The collective-timeout hook: the short timeout from the first completed step on, the start-up budget
again for the final save and teardown."""

from __future__ import annotations

from typing import TYPE_CHECKING

from truestep.resilience.timeouts import set_collective_timeout
from truestep.train.hooks.base import Hook

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer


class CollectiveTimeoutHook(Hook):
    def __init__(self) -> None:
        self.shortened = False

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        if not self.shortened:
            seconds = trainer.cfg.resilience.collective_timeout_s
            set_collective_timeout(trainer.ctx, seconds)
            self.shortened = True
            trainer.logs.event("collective_timeout_set", seconds=seconds)

    def on_end(self, trainer: Trainer) -> None:
        # The final save and teardown may take longer than a step: give them the start-up budget.
        if self.shortened:
            set_collective_timeout(trainer.ctx, trainer.cfg.parallel.init_timeout_s)
