"""The logging hook: one metrics.jsonl line per step, console progress, TensorBoard, and run_end with
the parameter digest."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from truestep.core.status import StopReason
from truestep.telemetry.digest import param_digest
from truestep.telemetry.progress import Progress
from truestep.telemetry.tensorboard import TensorBoardSink
from truestep.train.hooks.base import Hook, Slot

if TYPE_CHECKING:
    from truestep.train.restorer import Start
    from truestep.train.trainer import StepResult
    from truestep.train.view import StepView


def step_fields(view: StepView, result: StepResult) -> dict[str, float | int]:
    """The scalars of a step's metrics line (the resume self-check compares a replayed step by them)."""
    state = view.state
    return {
        "step": state.step,
        "loss": result.loss,
        "grad_norm": result.grad_norm,
        "lr": result.lr,
        "tokens_seen": state.tokens_seen,
        "step_time": result.step_time,
    }


class MetricsHook(Hook):
    slot = Slot.METRICS

    def __init__(self, tensorboard: TensorBoardSink) -> None:
        self.progress: Progress | None = None
        self.tensorboard = tensorboard

    def on_start(self, view: StepView, start: Start) -> None:
        m = view.cfg.metrics
        self.progress = Progress(
            view.cfg.train.max_steps, view.step, view.ctx.is_main and m.progress, m.log_every
        )
        self.tensorboard.open(view.step)

    def after_step(self, view: StepView, result: StepResult) -> None:
        fields = step_fields(view, result)
        per_source = view.tokens_per_source()
        # A mixture also logs the tokens drawn from each source, by its configured path.
        view.logs.metrics(**fields, **({"tokens_per_source": per_source} if per_source is not None else {}))
        self.tensorboard.scalars(view.step, fields)
        assert self.progress is not None
        self.progress.update(view.step, result.loss, view.tokens_per_step / max(result.step_time, 1e-9))

    def on_end(self, view: StepView) -> None:
        if self.progress is not None:
            self.progress.close()
        self.tensorboard.close()
        digest = param_digest(view.model, view.ctx)
        view.logs.event(
            "run_end",
            step=view.step,
            reason=str(view.stop_reason or StopReason.COMPLETED),
            param_digest=digest,
            state=asdict(view.state),
            end_wall=time.time(),
        )
