"""The Trainer: everything one rank holds (model, optimizer, data, state, logs) and the step itself."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule

import truestep
from truestep.config.fingerprint import fingerprint, trajectory_keys
from truestep.config.load import to_toml
from truestep.config.schema import JobConfig
from truestep.data import build_loader
from truestep.faults.hooks import poison_loss, set_context
from truestep.model.llama import Transformer
from truestep.parallel.dist import DistContext
from truestep.parallel.grad_norm import clip_grad_norm
from truestep.parallel.parallelize import parallelize
from truestep.telemetry.run_logs import RunLogs, next_attempt
from truestep.train.optimizer import build_optimizer, set_lr
from truestep.train.rng import seed_streams
from truestep.train.schedule import lr_at


@dataclass
class TrainState:
    """Counters that, with weights, optimizer, RNG and data position, define where the run is."""

    step: int = 0
    """Optimizer steps completed."""
    tokens_seen: int = 0
    """Training tokens consumed across all ranks."""
    wall_trained_s: float = 0.0
    """Wall-clock seconds spent in completed steps, summed over attempts (for goodput)."""
    attempts: int = 1
    """Attempts that have trained from this trajectory so far, this one included."""


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    lr: float
    step_time: float
    skipped: bool = False
    """True when the NaN guard skipped the update (non-finite loss or grad norm)."""


def _broadcast_int(value: int, ctx: DistContext) -> int:
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=ctx.device)
    dist.broadcast(t, src=0)
    return int(t.item())


class Trainer:
    def __init__(self, cfg: JobConfig, ctx: DistContext) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.run_dir = Path(cfg.run.dir)
        if ctx.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        set_context(run_dir=self.run_dir)
        attempt = _broadcast_int(next_attempt(self.run_dir) if ctx.is_main else 0, ctx)
        self.logs = RunLogs(self.run_dir, attempt, enabled=ctx.is_main)
        self.state = TrainState()
        self.stop_reason: str | None = None
        self.phase = "startup"
        """What the rank is doing, reported by the heartbeat: startup, train, checkpoint, shutdown."""
        if cfg.train.deterministic:
            # cuBLAS needs a fixed workspace to be deterministic; harmless on CPU.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)

        model = Transformer(cfg.model)
        model.init_weights(cfg.train.seed)
        self.model = parallelize(model, ctx, cfg)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.model, cfg)
        micro = cfg.train.micro_batch_size or cfg.train.global_batch_size // ctx.dp
        self.loader = build_loader(cfg.data, cfg.train.global_batch_size, micro, ctx.dp_rank, ctx.dp)
        if self.loader.dataset.vocab_size > cfg.model.vocab_size:
            raise ValueError(
                f"data vocabulary ({self.loader.dataset.vocab_size}) exceeds model.vocab_size="
                f"{cfg.model.vocab_size}; raise model.vocab_size"
            )
        seed_streams(cfg.train.seed, ctx.dp_rank, step=0)
        self.tokens_per_step = cfg.train.global_batch_size * cfg.data.seq_len

    def log_start(self) -> None:
        if self.ctx.is_main:
            (self.run_dir / "config.toml").write_text(to_toml(self.cfg))
        keys = trajectory_keys(self.cfg)
        self.logs.event(
            "run_start",
            name=self.cfg.run.name,
            config_fingerprint=fingerprint(keys),
            layout=self.ctx.layout(),
            device=str(self.ctx.device),
            num_threads=torch.get_num_threads(),
            torch_version=torch.__version__,
            start_step=self.state.step,
            process_start=truestep.STARTED_AT,
            max_steps=self.cfg.train.max_steps,
            state=asdict(self.state),
        )

    def _sync_grads(self, enabled: bool) -> None:
        # With accumulation, reduce-scatter only on the last micro-batch.
        if isinstance(self.model, FSDPModule):
            self.model.set_requires_gradient_sync(enabled)

    def train_step(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]]) -> StepResult:
        start = time.perf_counter()
        lr = lr_at(self.state.step, self.cfg)
        set_lr(self.optimizer, lr)
        self.model.train()
        local_loss = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        count = len(microbatches)
        for index, (inputs, targets) in enumerate(microbatches):
            self._sync_grads(index == count - 1)
            logits = self.model(inputs.to(self.ctx.device))
            loss = F.cross_entropy(logits.flatten(0, 1), targets.to(self.ctx.device).flatten())
            if index == 0 and poison_loss(self.state.step + 1):
                loss = loss * float("nan")
            (loss / count).backward()
            local_loss += loss.detach()
        grad_norm = clip_grad_norm(self.params, self.cfg.train.grad_clip, self.ctx)
        global_loss = local_loss / count
        if self.ctx.distributed and self.ctx.dp > 1:
            dist.all_reduce(global_loss, op=dist.ReduceOp.SUM, group=self.ctx.dp_group())
            global_loss /= self.ctx.dp
        # Both values are global (all-reduced), so every rank takes the same decision without a vote.
        skip = self.cfg.resilience.nan_guard and not bool(
            torch.isfinite(grad_norm) & torch.isfinite(global_loss)
        )
        if not skip:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.tokens_seen += self.tokens_per_step
        elapsed = time.perf_counter() - start
        self.state.wall_trained_s += elapsed
        return StepResult(float(global_loss.item()), float(grad_norm.item()), lr, elapsed, skip)
