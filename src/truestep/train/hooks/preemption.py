"""The preemption hook: watch for preemption signals and Ctrl-C from the start, and stop every rank at
the same step boundary once any rank got one (resilience.signal_agreement)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from truestep.resilience.signals import SignalWatcher
from truestep.train.hooks.base import Hook, Slot

if TYPE_CHECKING:
    from truestep.train.restorer import Start
    from truestep.train.trainer import StepResult
    from truestep.train.view import StepView


class PreemptionHook(Hook):
    slot = Slot.PREEMPTION

    def __init__(self) -> None:
        self.watcher: SignalWatcher | None = None

    def on_start(self, view: StepView, start: Start) -> None:
        r = view.cfg.resilience
        self.watcher = SignalWatcher(r.preemption_signals(), r.exit_deadline_s, r.requeue_exit_code + 1)

    def after_step(self, view: StepView, result: StepResult) -> None:
        assert self.watcher is not None
        if view.stop_reason is not None:
            return
        stop = self.watcher.agreed_stop(view.ctx, view.cfg.resilience.signal_agreement)
        if stop is not None:
            view.request_stop(stop)
            view.logs.event(
                "signal_received",
                signal=self.watcher.received or "peer",
                received_at=self.watcher.received_at,
                stop_step=view.step,
                stop_reason=str(stop),
            )

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
