"""The preemption hook: watch for preemption signals and Ctrl-C from the start, and stop every rank at
the same step boundary once any rank got one (resilience.signal_agreement). A signal that came during the
start-up or the restore stops the rank before its first step; the graceful-stop deadline follows the
job's measured step and save times."""

from __future__ import annotations

from typing import TYPE_CHECKING

from truestep.resilience.signals import SignalWatcher
from truestep.resilience.startup_stop import stop_if_signalled
from truestep.train.hooks.base import Hook, Slot

if TYPE_CHECKING:
    from truestep.train.restorer import Start
    from truestep.train.trainer import StepResult
    from truestep.train.view import StepView


class PreemptionHook(Hook):
    slot = Slot.PREEMPTION

    def __init__(self) -> None:
        self.watcher: SignalWatcher | None = None
        self.warned = False

    def on_start(self, view: StepView, start: Start) -> None:
        r = view.cfg.resilience
        self.watcher = SignalWatcher(r.preemption_signals(), r.exit_deadline_s, r.requeue_exit_code + 1)
        # A signal during the restore: stop before the first step (nothing new to save), not after it.
        where = "after the restore" if view.step else "after building the model"
        stop_if_signalled(view.cfg, view.ctx, where, view.logs.event, view.step, self.watcher.flag)

    def after_step(self, view: StepView, result: StepResult) -> None:
        r = view.cfg.resilience
        assert self.watcher is not None
        allowance, rule = r.exit_allowance(view.longest_step_s, view.logs.longest_save_s())
        self.watcher.deadline_s = allowance  # for a signal that comes later: the graceful stop may take this
        if allowance > r.scheduler_lead_time_s and not self.warned:
            self.warned = True
            view.logs.event(
                "exit_deadline_beyond_lead_time",
                deadline_s=allowance,
                rule=rule,
                scheduler_lead_time_s=r.scheduler_lead_time_s,
            )
        if view.stop_reason is not None:
            return
        stop = self.watcher.agreed_stop(view.ctx, r.signal_agreement)
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
