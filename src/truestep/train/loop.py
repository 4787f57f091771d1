"""The training loop: short on purpose. Everything else (logging, checkpoints, signals, the resume
self-check) is a hook; where the run starts is the restorer's (train/restorer.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from truestep.core.status import Phase, StopReason
from truestep.faults.hooks import fault_point
from truestep.train.hooks.base import Hook
from truestep.train.restorer import Restorer, Start
from truestep.train.trainer import Trainer
from truestep.train.view import StepView


def in_order(hooks: Sequence[Hook]) -> list[Hook]:
    """The hooks in `Slot` order (train/hooks/base.py), the one statement of who runs before whom."""
    slots = [h.slot for h in hooks]
    if len(set(slots)) != len(slots):
        raise ValueError(f"two hooks share a slot: {sorted(slots)}")
    return sorted(hooks, key=lambda h: h.slot)


def train_loop(trainer: Trainer, hooks: Sequence[Hook], restorer: Restorer) -> None:
    hooks = in_order(hooks)
    start = restorer.start()
    view = StepView(trainer)
    try:
        _run(trainer, hooks, restorer, view, start)
    finally:
        view.release()


def _run(trainer: Trainer, hooks: list[Hook], restorer: Restorer, view: StepView, start: Start) -> None:
    for hook in hooks:
        hook.on_start(view, start)
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
            hook.after_step(view, result)
        if view.take_rollback_request():
            restored = restorer.rollback()
            for hook in hooks:
                hook.on_rollback(view, restored)
        if stop_at and trainer.state.step >= stop_at:
            view.request_stop(StopReason.STOP_AT_STEP)
    trainer.status.phase = Phase.SHUTDOWN
    for hook in hooks:
        hook.on_end(view)
