"""Checkpoint policy: when to save (interval, final, emergency) and completing async saves. The mechanism
is the checkpoint room's (checkpoint/saver.py); where a run starts, and every restore, are the
restorer's (train/restorer.py)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from truestep.checkpoint.catalog import committed_dirs
from truestep.checkpoint.saver import Checkpointer
from truestep.core.status import Phase
from truestep.faults.hooks import set_context as set_fault_context
from truestep.telemetry.digest import local_digest
from truestep.train.hooks.base import Hook, Slot

if TYPE_CHECKING:
    from truestep.train.restorer import Start
    from truestep.train.trainer import StepResult
    from truestep.train.view import StepView


class CheckpointHook(Hook):
    slot = Slot.CHECKPOINT

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer

    def on_start(self, view: StepView, start: Start) -> None:
        set_fault_context(newest_committed=partial(self._newest_committed, self.checkpointer.root))

    def _newest_committed(self, root: Path) -> Path | None:
        """The checkpoint a restart would resume from, once a commit this rank has under way is done."""
        self.checkpointer.join_commit()
        return next(iter(committed_dirs(root)), None)

    def _save(self, view: StepView, reason: str) -> None:
        model = view.model
        digest = lambda: local_digest(model)  # noqa: E731 - computed inside save's timing
        self.checkpointer.save(view.step, view.checkpointable, reason, digest)

    def after_step(self, view: StepView, result: StepResult) -> None:
        with view.phase(Phase.CHECKPOINT):
            self.checkpointer.poll()
            interval = view.cfg.checkpoint.interval
            if interval and view.step % interval == 0:
                self._save(view, "interval")

    def on_end(self, view: StepView) -> None:
        with view.phase(Phase.CHECKPOINT):
            self._save(view, str(view.stop_reason or "final"))
            self.checkpointer.wait()
