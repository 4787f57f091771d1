"""The hook interface: three moments of the loop and the rank's return, each a no-op unless a hook
overrides it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer


class Hook:
    """One responsibility each; called in list order."""

    def on_start(self, trainer: Trainer) -> None:
        """Before the first step (restore happens here)."""

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        """After every optimizer step."""

    def on_end(self, trainer: Trainer) -> None:
        """After the last step, whatever stopped the loop."""

    def close(self) -> None:
        """The rank is returning (after it left the process group, whether the loop ran or not): undo
        what this hook changed in the process (signal handlers), so a rank run in-process leaves
        nothing behind."""
