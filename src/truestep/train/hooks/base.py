"""The hook interface: the moments of the loop and the rank's return, each a no-op unless a hook overrides
it, and the one place that says in which order hooks run (`Slot`).

A hook sees the run through a `StepView` (train/view.py): what it may read, and the few requests it may
make of the loop (stop, roll back, the phase the heartbeat reports). It receives what a restore did as the
`Start` / `Restored` value the loop hands it, never by asking another hook: no hook holds another hook.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from truestep.checkpoint.restored import Restored
    from truestep.train.restorer import Start
    from truestep.train.trainer import StepResult
    from truestep.train.view import StepView


class Slot(enum.IntEnum):
    """Where a hook runs among the others, at every moment (on_start, after_step, on_rollback, on_end).
    The order carries weight; each member says why it stands where it does."""

    SELF_CHECK = 10
    """Judges a step before anything else sees it: a diverged resume stops before a checkpoint saves it."""
    CHECKPOINT = 20
    """Saves the state a step produced (interval), the final or emergency save at the end."""
    SNAPSHOT = 25
    """Copies the state a step produced into host memory (and its buddies'), after the self-check judged it."""
    WITNESS = 30
    """Takes evidence of the state just saved at a graceful stop: after the final save, before run_end."""
    TIMEOUTS = 40
    """Shortens the collective timeout after the first step, restores the start-up budget for the end."""
    METRICS = 50
    """The step's metrics line and run_end (with the parameter digest of the final state)."""
    EVAL = 55
    """Held-out evaluation at its interval, after the step's own line (it changes nothing a later hook reads)."""
    NAN_GUARD = 60
    """Asks for a rollback after too many non-finite steps (the loop performs it after every hook ran)."""
    PREEMPTION = 70
    """Agrees on a stop signal across ranks last, so every rank stops at the same step boundary."""


class Hook:
    """One responsibility each; the loop calls hooks in `slot` order (train/loop.py `in_order`)."""

    slot: ClassVar[Slot]

    def on_start(self, view: StepView, start: Start) -> None:
        """Before the first step, after the run's state was restored (or initialized): `start` says which."""

    def after_step(self, view: StepView, result: StepResult) -> None:
        """After every optimizer step."""

    def on_rollback(self, view: StepView, restored: Restored) -> None:
        """After the loop rolled the run back to a checkpoint in place (the NaN guard asked for it)."""

    def on_end(self, view: StepView) -> None:
        """After the last step, whatever stopped the loop."""

    def close(self) -> None:
        """The rank is returning (after it left the process group, whether the loop ran or not): undo
        what this hook changed in the process (signal handlers), so a rank run in-process leaves
        nothing behind."""
