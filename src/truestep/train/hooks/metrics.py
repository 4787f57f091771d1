"""The logging hook: one metrics.jsonl line per step (with every rank's peak memory), console progress
(a bar on a terminal, plain step lines elsewhere), TensorBoard and W&B, and run_end with the parameter
digest."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from truestep.core.status import StopReason
from truestep.model.flops import flops_per_token
from truestep.parallel.parallelize import uses_mixed_precision
from truestep.telemetry.digest import param_digest
from truestep.telemetry.progress import Progress, StepStats
from truestep.telemetry.tensorboard import ScalarSinks
from truestep.telemetry.throughput import device_peak_flops, mfu
from truestep.train.hooks.base import Hook, Slot
from truestep.train.memory_check import peak_over_ranks, peaks_per_rank

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

    def __init__(self, sinks: ScalarSinks) -> None:
        self.progress: Progress | None = None
        self.sinks = sinks
        self.flops_per_token = 0.0
        self.peak_flops: float | None = None

    def on_start(self, view: StepView, start: Start) -> None:
        cfg, ctx = view.cfg, view.ctx
        m = cfg.metrics
        self.progress = Progress(
            cfg.train.max_steps, view.step, ctx.is_main, m.log_every, bar=m.progress, lines=m.step_lines
        )
        self.sinks.open(view.step)
        self.flops_per_token = flops_per_token(cfg.model, cfg.data.seq_len)
        bf16 = ctx.dp > 1 and uses_mixed_precision(cfg, ctx.device.type)
        self.peak_flops = device_peak_flops(ctx.device, bf16)

    def after_step(self, view: StepView, result: StepResult) -> None:
        fields = step_fields(view, result)
        per_source = view.tokens_per_source()
        peak = peak_over_ranks(view.ctx)  # collective: every rank runs this hook
        # A mixture also logs the tokens drawn from each source, by its configured path.
        view.logs.metrics(
            **fields,
            peak_mem_bytes=peak,
            **({"tokens_per_source": per_source} if per_source is not None else {}),
        )
        self.sinks.train(view.step, {**fields, "peak_mem_bytes": peak})
        assert self.progress is not None
        tokens_per_s = view.tokens_per_step / max(result.step_time, 1e-9)
        world = view.ctx.world_size
        self.progress.update(
            StepStats(
                view.step,
                result.loss,
                result.lr,
                result.grad_norm,
                tokens_per_s,
                peak,
                mfu(tokens_per_s, self.flops_per_token, self.peak_flops, world),
            )
        )

    def on_end(self, view: StepView) -> None:
        if self.progress is not None:
            self.progress.close()
        self.sinks.close()
        digest = param_digest(view.model, view.ctx)
        peaks = peaks_per_rank(view.ctx)
        view.logs.event(
            "run_end",
            step=view.step,
            reason=str(view.stop_reason or StopReason.COMPLETED),
            param_digest=digest,
            peak_mem_bytes_per_rank=peaks,
            state=asdict(view.state),
            end_wall=time.time(),
        )

    def close(self) -> None:
        self.sinks.close()
