"""The preemption hook: watch for preemption signals and Ctrl-C from the start, and stop every rank at
the same step boundary once any rank got one (resilience.signal_agreement)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from truestep.resilience.signals import SignalWatcher
from truestep.train.hooks.base import Hook

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer


class PreemptionHook(Hook):
    def __init__(self) -> None:
        self.watcher: SignalWatcher | None = None

    def on_start(self, trainer: Trainer) -> None:
        r = trainer.cfg.resilience
        self.watcher = SignalWatcher(r.preemption_signals(), r.exit_deadline_s, r.requeue_exit_code + 1)

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        assert self.watcher is not None
        if trainer.stop_reason is not None:
            return
        stop = self.watcher.agreed_stop(trainer.ctx, trainer.cfg.resilience.signal_agreement)
        if stop is not None:
            trainer.stop_reason = stop
            trainer.logs.event(
                "signal_received",
                signal=self.watcher.received or "peer",
                received_at=self.watcher.received_at,
                stop_step=trainer.state.step,
                stop_reason=str(stop),
            )

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
