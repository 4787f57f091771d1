"""The training loop: short on purpose. Everything else (logging, checkpoints, signals, faults) is a hook."""

from __future__ import annotations

from typing import Protocol

from truestep.faults.hooks import fault_point
from truestep.train.trainer import StepResult, Trainer


class Hook(Protocol):
    """One responsibility each; called in list order."""

    def on_start(self, trainer: Trainer) -> None: ...

    def after_step(self, trainer: Trainer, result: StepResult) -> None: ...

    def on_end(self, trainer: Trainer) -> None: ...


def train_loop(trainer: Trainer, hooks: list[Hook]) -> None:
    for hook in hooks:
        hook.on_start(trainer)
    trainer.log_start()
    max_steps = trainer.cfg.train.max_steps
    stop_at = trainer.cfg.train.stop_at_step
    while trainer.state.step < max_steps and trainer.stop_reason is None:
        fault_point("train:step", step=trainer.state.step + 1)
        microbatches = trainer.loader.next()
        result = trainer.train_step(microbatches)
        trainer.phase = "train"  # the first step (slow: warm-up, allocation) counts as start-up
        for hook in hooks:
            hook.after_step(trainer, result)
        if stop_at and trainer.state.step >= stop_at:
            trainer.stop_reason = "stop_at_step"
    trainer.phase = "shutdown"
    for hook in hooks:
        hook.on_end(trainer)
