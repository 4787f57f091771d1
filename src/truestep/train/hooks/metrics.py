"""The logging hook: one metrics.jsonl line per step, console progress, TensorBoard, and run_end with
the parameter digest."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from truestep.core.names import TENSORBOARD_DIR
from truestep.core.status import StopReason
from truestep.model.flops import flops_per_token
from truestep.parallel.parallelize import uses_mixed_precision
from truestep.telemetry.digest import param_digest
from truestep.telemetry.progress import Progress, StepStats
from truestep.telemetry.tensorboard import TensorBoardWriter
from truestep.telemetry.throughput import device_peak_flops, mfu
from truestep.telemetry.wandb_logger import WandbWriter
from truestep.train.hooks.base import Hook
from truestep.train.memory_check import peak_over_ranks, peaks_per_rank

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
        self.wandb: WandbWriter | None = None
        self.flops_per_token = 0.0
        self.peak_flops: float | None = None

    def on_start(self, trainer: Trainer) -> None:
        cfg, ctx = trainer.cfg, trainer.ctx
        m = cfg.metrics
        main = ctx.is_main
        self.progress = Progress(
            cfg.train.max_steps, trainer.state.step, main, m.log_every, bar=m.progress, lines=m.step_lines
        )
        if main and m.tensorboard:
            self.tensorboard = TensorBoardWriter(trainer.run_dir / TENSORBOARD_DIR, trainer.state.step)
        if main and m.wandb != "off":
            self.wandb = WandbWriter(trainer.run_dir, cfg, m.wandb, trainer.logs.attempt)
        self.flops_per_token = flops_per_token(cfg.model, cfg.data.seq_len)
        bf16 = ctx.dp > 1 and uses_mixed_precision(cfg, ctx.device.type)
        self.peak_flops = device_peak_flops(ctx.device, bf16)

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
            self.tensorboard.scalars(state.step, {**fields, "peak_mem_bytes": peak})
        if self.wandb is not None:
            self.wandb.log(state.step, {f"train/{k}": v for k, v in fields.items() if k != "step"})
        assert self.progress is not None
        tokens_per_s = trainer.tokens_per_step / max(result.step_time, 1e-9)
        world = trainer.ctx.world_size
        self.progress.update(
            StepStats(
                state.step,
                result.loss,
                result.lr,
                result.grad_norm,
                tokens_per_s,
                peak,
                mfu(tokens_per_s, self.flops_per_token, self.peak_flops, world),
            )
        )

    def on_end(self, trainer: Trainer) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.close()
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

    def close(self) -> None:
        """Also when the loop did not end normally: the W&B run is finished either way."""
        if self.wandb is not None:
            wandb, self.wandb = self.wandb, None
            wandb.close()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Scalars outside train/ (e.g. eval/loss) to TensorBoard and W&B, when they are on."""
        for tag, value in values.items():
            if self.tensorboard is not None:
                self.tensorboard.scalar(tag, value, step)
        if self.wandb is not None:
            self.wandb.log(step, values)
