"""The snapshot hook (resilience.snapshot_every_steps > 0): after every step, agree on the snapshot in
flight and take the next one when it is due; the next optimizer update waits until the copy of the state
it changes is taken (checkpoint/memory/snapshotter.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from truestep.checkpoint.memory.snapshotter import Snapshotter
from truestep.train.hooks.base import Hook, Slot

if TYPE_CHECKING:
    from truestep.checkpoint.restored import Restored
    from truestep.train.memory import MemoryPath
    from truestep.train.restorer import Start
    from truestep.train.trainer import StepResult
    from truestep.train.view import StepView


class SnapshotHook(Hook):
    slot = Slot.SNAPSHOT

    def __init__(self, memory: MemoryPath) -> None:
        self.memory = memory
        self.snapshotter: Snapshotter | None = None

    def on_start(self, view: StepView, start: Start) -> None:
        self.snapshotter = self.memory.start_snapshots()  # collective: its group
        view.before_optimizer_step(self.snapshotter.wait_captured)

    def after_step(self, view: StepView, result: StepResult) -> None:
        assert self.snapshotter is not None
        self.snapshotter.after_step(view.step)

    def on_rollback(self, view: StepView, restored: Restored) -> None:
        assert self.snapshotter is not None
        self.snapshotter.close()
        self.snapshotter.agreed = None
        self.memory.forget()  # the rollback began a new timeline

    def on_end(self, view: StepView) -> None:
        if self.snapshotter is not None:
            self.snapshotter.close()
        if view.stop_reason is None:  # completed: nothing will ever restore from this memory
            self.memory.release()

    def close(self) -> None:
        if self.snapshotter is not None:
            self.snapshotter.close()
