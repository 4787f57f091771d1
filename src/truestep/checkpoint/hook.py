"""The checkpoint hook: resume at start, interval saves, async completion, final/emergency save at the end.

Policy (when to save) lives here; mechanism (how) in saver/state/resolver.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from truestep.checkpoint.resolver import ResumeError, resolve_resume
from truestep.checkpoint.saver import Checkpointer
from truestep.checkpoint.state import restore

if TYPE_CHECKING:
    from collections.abc import Iterator

    from truestep.train.trainer import StepResult, Trainer


@contextmanager
def _phase(trainer: Trainer, name: str) -> Iterator[None]:
    """Tell the heartbeat the rank is checkpointing, so slow writes are not mistaken for hangs."""
    previous, trainer.phase = trainer.phase, name
    try:
        yield
    finally:
        trainer.phase = previous


class CheckpointHook:
    def __init__(self) -> None:
        self.checkpointer: Checkpointer | None = None

    def on_start(self, trainer: Trainer) -> None:
        self.checkpointer = Checkpointer(trainer)
        cfg = trainer.cfg.checkpoint
        ckpt_dir = None
        if cfg.resume:
            ckpt_dir = resolve_resume(self.checkpointer.root, cfg, trainer.ctx, trainer.logs)
            if ckpt_dir is not None:
                self._restore(trainer, ckpt_dir)
        if ckpt_dir is None and cfg.init_from:
            # A fresh run starting from given weights (e.g. imported from Hugging Face); collective.
            from truestep.interop.init import init_from_checkpoint

            facts = init_from_checkpoint(
                trainer.model, cfg.init_from, cfg.verify_checksums, trainer.ctx.is_main
            )
            trainer.logs.event("init_from", **facts)

    def _restore(self, trainer: Trainer, ckpt_dir: Path) -> None:
        assert self.checkpointer is not None
        started = time.perf_counter()
        facts = restore(trainer, ckpt_dir)
        self.checkpointer.last_saved_step = trainer.state.step
        trainer.logs.event(
            "checkpoint_restore", path=str(ckpt_dir), restore_s=time.perf_counter() - started, **facts
        )

    def rollback(self, trainer: Trainer) -> int:
        """Collective. Restore the newest verified checkpoint in place; returns its step."""
        assert self.checkpointer is not None
        with _phase(trainer, "checkpoint"):
            self.checkpointer.wait()
            ckpt_dir = resolve_resume(
                self.checkpointer.root, trainer.cfg.checkpoint, trainer.ctx, trainer.logs
            )
            if ckpt_dir is None:
                raise ResumeError("rollback requested but there is no checkpoint to roll back to")
            self._restore(trainer, ckpt_dir)
        return trainer.state.step

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        assert self.checkpointer is not None
        with _phase(trainer, "checkpoint"):
            self.checkpointer.poll()
            interval = trainer.cfg.checkpoint.interval
            if interval and trainer.state.step % interval == 0:
                self.checkpointer.save(trainer, reason="interval")

    def on_end(self, trainer: Trainer) -> None:
        assert self.checkpointer is not None
        with _phase(trainer, "checkpoint"):
            self.checkpointer.save(trainer, reason=trainer.stop_reason or "final")
            self.checkpointer.wait()
