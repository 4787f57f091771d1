"""Collective timeouts: generous for start-up, restore and the first step; short afterwards, so a rank
waiting on a dead or hung peer raises in seconds rather than after the 10-30 minute default."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist
from torch.distributed.distributed_c10d import _set_pg_timeout

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer


def set_collective_timeout(trainer: Trainer, seconds: float) -> None:
    """Apply to the default group and every mesh group (private torch API, checked by a test)."""
    ctx = trainer.ctx
    if not ctx.distributed:
        return
    assert ctx.mesh is not None
    timeout = timedelta(seconds=seconds)
    groups = {id(g): g for g in [dist.group.WORLD, *(ctx.mesh[d].get_group() for d in ("dp", "tp"))]}
    for group in groups.values():
        _set_pg_timeout(timeout, group)


class CollectiveTimeoutHook:
    def __init__(self) -> None:
        self.shortened = False

    def on_start(self, trainer: Trainer) -> None:
        pass

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        if not self.shortened:
            set_collective_timeout(trainer, trainer.cfg.resilience.collective_timeout_s)
            self.shortened = True
            trainer.logs.event("collective_timeout_set", seconds=trainer.cfg.resilience.collective_timeout_s)

    def on_end(self, trainer: Trainer) -> None:
        # The final save and teardown may take longer than a step: give them the start-up budget.
        if self.shortened:
            set_collective_timeout(trainer, trainer.cfg.parallel.init_timeout_s)
