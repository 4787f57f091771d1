"""The checkpoint hook: resume at start, interval saves, async completion, final save at the end.

Policy (when to save) lives here; mechanism (how) in saver/state/resolver.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from truestep.checkpoint.resolver import resolve_resume
from truestep.checkpoint.saver import Checkpointer
from truestep.checkpoint.state import restore

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer


class CheckpointHook:
    def __init__(self) -> None:
        self.checkpointer: Checkpointer | None = None

    def on_start(self, trainer: Trainer) -> None:
        self.checkpointer = Checkpointer(trainer)
        if not trainer.cfg.checkpoint.resume:
            return
        ckpt_dir = resolve_resume(self.checkpointer.root, trainer.cfg.checkpoint, trainer.ctx, trainer.logs)
        if ckpt_dir is None:
            return
        started = time.perf_counter()
        facts = restore(trainer, ckpt_dir)
        self.checkpointer.last_saved_step = trainer.state.step
        trainer.logs.event(
            "checkpoint_restore", path=str(ckpt_dir), restore_s=time.perf_counter() - started, **facts
        )

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        assert self.checkpointer is not None
        self.checkpointer.poll()
        interval = trainer.cfg.checkpoint.interval
        if interval and trainer.state.step % interval == 0:
            self.checkpointer.save(trainer, reason="interval")

    def on_end(self, trainer: Trainer) -> None:
        assert self.checkpointer is not None
        self.checkpointer.save(
            trainer, reason="final" if trainer.stop_reason is None else trainer.stop_reason
        )
        self.checkpointer.wait()
