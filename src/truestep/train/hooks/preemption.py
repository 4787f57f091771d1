"""The preemption hook: watch for preemption signals and Ctrl-C from the start, and stop every rank at
the same step boundary once any rank got one (resilience.signal_agreement). A signal that came during
start-up stops the rank before its first step (resilience/startup_stop.py). After every step the
forced-exit deadline is re-fitted to the job's measured step and save times
(ResilienceConfig.exit_allowance), and said once if it no longer fits the scheduler's warning."""

from __future__ import annotations

from typing import TYPE_CHECKING

from truestep.resilience.signals import SignalWatcher
from truestep.resilience.startup_stop import stop_if_signalled
from truestep.train.hooks.base import Hook

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer


class PreemptionHook(Hook):
    def __init__(self) -> None:
        self.watcher: SignalWatcher | None = None
        self.warned = False

    def on_start(self, trainer: Trainer) -> None:
        r = trainer.cfg.resilience
        self.watcher = SignalWatcher(r.preemption_signals(), r.exit_deadline_s, r.requeue_exit_code + 1)
        # A signal during the restore: stop before the first step (nothing new to save), not after it.
        where = "after the restore" if trainer.state.step else "after building the model"
        stop_if_signalled(
            trainer.cfg, trainer.ctx, where, trainer.logs.event, trainer.state.step, self.watcher.flag
        )

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        r = trainer.cfg.resilience
        assert self.watcher is not None
        allowance, rule = r.exit_allowance(trainer.status.longest_step_s, trainer.logs.longest_save_s())
        self.watcher.deadline_s = allowance  # for a signal that comes later: the graceful stop may take this
        if allowance > r.scheduler_lead_time_s and not self.warned:
            self.warned = True
            trainer.logs.event(
                "exit_deadline_beyond_lead_time",
                deadline_s=allowance,
                rule=rule,
                scheduler_lead_time_s=r.scheduler_lead_time_s,
            )
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
