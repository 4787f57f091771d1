"""The logging hook: one metrics.jsonl line per step, console progress, TensorBoard, and run_end with
the parameter digest."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from truestep.core.names import TENSORBOARD_DIR
from truestep.core.status import StopReason
from truestep.telemetry.digest import param_digest
from truestep.telemetry.progress import Progress
from truestep.telemetry.tensorboard import TensorBoardWriter
from truestep.train.hooks.base import Hook
from truestep.train.memory import peak_over_ranks, peaks_per_rank

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer


def step_fields(trainer: Trainer, result: StepResult) -> dict[str, float | int]:
    """The scalars of a step's metrics line (the resume self-check compares a replayed step by them)."""
    return {
        "step": trainer.state.step,
        "loss": result.loss,
        "grad_norm": result.grad_norm,
        "lr": result.lr,
        "tokens_seen": trainer.state.tokens_seen,
        "step_time": result.step_time,
    }


class MetricsHook(Hook):
    def __init__(self) -> None:
        self.progress: Progress | None = None
        self.tensorboard: TensorBoardWriter | None = None

    def on_start(self, trainer: Trainer) -> None:
        m = trainer.cfg.metrics
        main = trainer.ctx.is_main
        self.progress = Progress(
            trainer.cfg.train.max_steps, trainer.state.step, main and m.progress, m.log_every
        )
        if main and m.tensorboard:
            self.tensorboard = TensorBoardWriter(trainer.run_dir / TENSORBOARD_DIR, trainer.state.step)

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        state = trainer.state
        fields = step_fields(trainer, result)
        per_source = trainer.loader.tokens_per_source()
        # A mixture also logs the tokens drawn from each source, by its configured path.
        peak = peak_over_ranks(trainer.ctx)  # collective: every rank runs this hook
        trainer.logs.metrics(
            **fields,
            peak_mem_bytes=peak,
            **({"tokens_per_source": per_source} if per_source is not None else {}),
        )
        if self.tensorboard is not None:
            self.tensorboard.scalars(state.step, fields)
        assert self.progress is not None
        self.progress.update(state.step, result.loss, trainer.tokens_per_step / max(result.step_time, 1e-9))

    def on_end(self, trainer: Trainer) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        digest = param_digest(trainer.model, trainer.ctx)
        peaks = peaks_per_rank(trainer.ctx)
        trainer.logs.event(
            "run_end",
            step=trainer.state.step,
            reason=str(trainer.stop_reason or StopReason.COMPLETED),
            param_digest=digest,
            peak_mem_bytes_per_rank=peaks,
            state=asdict(trainer.state),
            end_wall=time.time(),
        )
