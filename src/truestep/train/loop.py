"""The training loop: short on purpose. Everything else (logging, checkpoints, signals, faults) is a hook."""

from __future__ import annotations

import time

from truestep.core.status import Phase, StopReason
from truestep.faults.hooks import fault_point
from truestep.train.hooks.base import Hook
from truestep.train.trainer import Trainer


def train_loop(trainer: Trainer, hooks: list[Hook]) -> None:
    for hook in hooks:
        hook.on_start(trainer)
    trainer.status.step = trainer.state.step
    trainer.log_start()
    max_steps = trainer.cfg.train.max_steps
    stop_at = trainer.cfg.train.stop_at_step
    while trainer.state.step < max_steps and trainer.stop_reason is None:
        began = time.perf_counter()
        fault_point("train:step", step=trainer.state.step + 1)
        microbatches = trainer.loader.next()
        result = trainer.train_step(microbatches)
        took = time.perf_counter() - began
        trainer.status.longest_step_s = max(trainer.status.longest_step_s, took)
        trainer.status.step = trainer.state.step
        trainer.status.phase = Phase.TRAIN  # the first step (slow: warm-up, allocation) counts as start-up
        for hook in hooks:
            hook.after_step(trainer, result)
        if stop_at and trainer.state.step >= stop_at and trainer.stop_reason is None:
            trainer.stop_reason = StopReason.STOP_AT_STEP
    trainer.status.phase = Phase.SHUTDOWN
    for hook in hooks:
        hook.on_end(trainer)
