"""The Trainer: everything one rank holds (model, optimizer, data, counters) and the step itself.

It is also what a checkpoint saves and loads (checkpoint.state.Checkpointable): DCP-able weights and
optimizer state, and a JSON-safe RankState. Nothing outside reaches into it to set fields: hooks see it
through a StepView (train/view.py), the restorer through Checkpointable.
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule

import truestep
from truestep.checkpoint.catalog import committed_dirs, run_checkpoint_root
from truestep.checkpoint.init_from import precheck_init_from
from truestep.checkpoint.ownership import current_run_id
from truestep.checkpoint.resolver import ResumeError
from truestep.checkpoint.restored import RngPolicy
from truestep.checkpoint.state import RankState
from truestep.config.errors import ConfigError
from truestep.config.fingerprint import fingerprint, trajectory_keys
from truestep.config.load import to_toml
from truestep.config.schema import JobConfig
from truestep.core.fsio import atomic_write
from truestep.core.names import CONFIG_FILE
from truestep.core.status import RankStatus, StopReason
from truestep.data import build_loader
from truestep.faults.hooks import armed as armed_faults
from truestep.faults.hooks import poison_loss
from truestep.model.llama import count_parameters
from truestep.model.recompute import set_activation_checkpointing
from truestep.parallel.dist import DistContext
from truestep.parallel.grad_norm import clip_grad_norm
from truestep.parallel.parallelize import build_model, init_parameters, uses_mixed_precision
from truestep.resilience.startup_stop import stop_if_signalled
from truestep.telemetry import startup
from truestep.telemetry.digest import param_digest
from truestep.telemetry.run_logs import RunLogs
from truestep.train.emulation import GradientNoise, RestoreError
from truestep.train.loss import StepLoss
from truestep.train.memory_check import check_memory
from truestep.train.optimizer import build_optimizer, set_lr
from truestep.train.provenance import provenance
from truestep.train.rng import capture_rng, restore_rng, seed_streams
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

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> TrainState:
        """The counters of a rank-state file, each checked for its type (the file is untrusted input)."""
        values = {}
        for f in dataclasses.fields(cls):
            value = saved.get(f.name)
            kinds = (int,) if f.type in (int, "int") else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds) or value < 0:
                raise ResumeError(
                    f"checkpoint train_state.{f.name} is {value!r}, not a non-negative {f.type}"
                )
            values[f.name] = value
        return cls(**values)


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    lr: float
    step_time: float
    skipped: bool = False
    """True when the NaN guard skipped the update (non-finite loss or grad norm)."""


class Trainer:
    def __init__(self, cfg: JobConfig, ctx: DistContext, logs: RunLogs, status: RankStatus) -> None:
        """Allocate what this rank holds; nothing is initialized yet. A resume loads every parameter; a
        fresh start calls `initialize` (train/restorer.py). No step runs before one of them."""
        built = time.perf_counter()
        self.cfg = cfg
        self.ctx = ctx
        self.logs = logs
        self.status = status
        self.run_dir = Path(cfg.run.dir)
        self.state = TrainState()
        self.stop_reason: StopReason | None = None
        if cfg.train.deterministic:
            # cuBLAS needs a fixed workspace to be deterministic; harmless on CPU.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)

        if cfg.checkpoint.init_from and not committed_dirs(
            run_checkpoint_root(self.run_dir, cfg.checkpoint.dir)
        ):
            # A fresh start from given weights: refuse a misfit before allocating the model.
            precheck_init_from(cfg.checkpoint.init_from, cfg.model)
        stop_if_signalled(cfg, ctx, "before building the model", logs.event, 0)  # preempted while starting
        self.memory_estimate = check_memory(cfg, ctx, logs)  # before anything big is allocated
        self.model = build_model(ctx, cfg, initialize=False)  # a resume draws no random init
        set_activation_checkpointing(self.model, cfg.train.activation_checkpointing)
        self.weights_set = False
        """True once the weights are initialized or loaded whole: before that a step is refused."""
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.model, cfg)
        micro = cfg.train.micro_batch(ctx.dp)
        self.loader = build_loader(
            cfg.data,
            cfg.train.global_batch_size,
            micro,
            ctx.dp_rank,
            ctx.dp,
            allow_mixture_change=cfg.checkpoint.allow_config_change,
        )
        if self.loader.vocab_size > cfg.model.vocab_size:
            raise ConfigError(
                f"data vocabulary ({self.loader.vocab_size}) exceeds model.vocab_size="
                f"{cfg.model.vocab_size}; raise model.vocab_size"
            )
        seed_streams(cfg.train.seed, ctx.dp_rank, step=0)
        self.initial_data_position = self.loader.state_dict()
        self.tokens_per_step = cfg.train.global_batch_size * cfg.data.seq_len
        self.trajectory_keys = trajectory_keys(cfg)
        t = cfg.train
        self.gradient_noise = (
            GradientNoise(t.emulate_nondeterminism, ctx) if t.emulate_nondeterminism else None
        )
        self.restore_error = RestoreError(t.emulate_restore_error, ctx) if t.emulate_restore_error else None
        startup.add("build", time.perf_counter() - built)

    def log_start(self) -> None:
        if self.ctx.is_main:
            atomic_write(self.run_dir / CONFIG_FILE, to_toml(self.cfg).encode())
        self.logs.event(
            "run_start",
            name=self.cfg.run.name,
            config_fingerprint=fingerprint(self.trajectory_keys),
            trajectory_keys=self.trajectory_keys,  # so the instrument can name what differs
            layout=self.ctx.layout(),
            device=str(self.ctx.device),
            num_threads=torch.get_num_threads(),
            torch_version=torch.__version__,
            start_step=self.state.step,
            process_start=truestep.STARTED_AT,
            pid=os.getpid(),  # with process_start and this event's time: which process this attempt was
            handoff_at=truestep.HANDED_OVER_AT,  # a forked rank's life began here (truestep/__init__.py)
            max_steps=self.cfg.train.max_steps,
            faults=[spec.text for spec in armed_faults()],  # an armed fault is never silent
            state=asdict(self.state),
            parameters=count_parameters(self.cfg.model),
            compute_dtype="bfloat16"
            if self.ctx.dp > 1 and uses_mixed_precision(self.cfg, self.ctx.device.type)
            else "float32",
            activation_checkpointing=self.cfg.train.activation_checkpointing,
            data=self.cfg.data.path
            or ", ".join(f"{s.path} ({s.weight:g})" for s in self.cfg.data.sources)
            or "built-in demo corpus",
            run_id=current_run_id(self.run_dir),  # whose logs these are (analysis/provenance.py)
            provenance=provenance(self.loader, self.cfg.checkpoint.init_from, self.state.step == 0),
            startup_phases=startup.snapshot(),  # seconds: import, build, init, verify, load
        )

    # --- the step ----------------------------------------------------------------------------------

    def _sync_grads(self, enabled: bool) -> None:
        # With accumulation, reduce-scatter only on the last micro-batch.
        if isinstance(self.model, FSDPModule):
            self.model.set_requires_gradient_sync(enabled)

    def train_step(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]]) -> StepResult:
        if not self.weights_set:  # allocated memory, or a load that failed part-way, is never trained on
            raise RuntimeError("a training step on weights neither initialized nor loaded whole")
        start = time.perf_counter()
        lr = lr_at(self.state.step, self.cfg)
        set_lr(self.optimizer, lr)
        self.model.train()
        local_loss = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        # Pretraining: the mean of the micro-batches' means; chat data: each micro-batch's loss sum over
        # its trained tokens, divided by the global batch's count of them (train/loss.py).
        losses = StepLoss(microbatches, self.ctx, self.loader.loss_masked)
        count = len(microbatches)
        for index, (inputs, targets) in enumerate(microbatches):
            self._sync_grads(index == count - 1)
            logits = self.model(inputs.to(self.ctx.device))
            loss = losses.microbatch(logits, targets.to(self.ctx.device))
            if index == 0 and poison_loss(self.state.step + 1):
                loss = loss * float("nan")
            losses.for_backward(loss).backward()
            local_loss += loss.detach()
        if self.gradient_noise is not None:
            self.gradient_noise.perturb(self.params, self.state.step)
        grad_norm = clip_grad_norm(self.params, self.cfg.train.grad_clip, self.ctx)
        global_loss = losses.global_loss(local_loss)
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

    # --- what a checkpoint saves and loads (checkpoint.state.Checkpointable) ------------------------

    def dcp_state_dict(self, with_optimizer: bool) -> dict[str, Any]:
        # Before any weights are set, this is a restore's call: the optimizer state it materializes for the
        # load (a zero-gradient step) is part of the start-up's load phase.
        with startup.timed("load") if not self.weights_set else nullcontext():
            state: dict[str, Any] = {"model": get_model_state_dict(self.model)}
            if with_optimizer:
                state["optim"] = get_optimizer_state_dict(self.model, self.optimizer)
        return state

    def load_dcp_state_dict(self, state: dict[str, Any]) -> None:
        """Every item of `state` was loaded (checkpoint/restore.py and checkpoint/memory/restore.py call
        this only then)."""
        with startup.timed("load"):
            set_model_state_dict(self.model, state["model"])
            if "optim" in state:
                set_optimizer_state_dict(self.model, self.optimizer, state["optim"])
        self.weights_set = True
        if self.restore_error is not None:
            self.restore_error.perturb(self.params)

    def initialize(self) -> None:
        """A fresh start: the initial weights from `train.seed` (each rank its own shards,
        `train.init_scheme`), no optimizer state, counters, data position and RNG streams at step 0.
        Local (no collective). Called at every fresh start, also one after restores that failed
        part-way, which must inherit nothing of them: a load can fail after the optimizer state was
        materialized for it (one zero-gradient step counted), after items were copied into the model
        (a verified load streams each item into its target and the ranks agree at the end), or after
        everything was loaded (a restored-digest mismatch)."""
        with startup.timed("init"):
            init_parameters(self.model, self.cfg.train.seed, self.cfg.train.init_scheme)
        self.optimizer.state.clear()  # a fresh AdamW has no state until its first step
        self.state = TrainState()
        self.loader.load_state_dict(self.initial_data_position)
        seed_streams(self.cfg.train.seed, self.ctx.dp_rank, step=0)
        self.weights_set = True

    def param_digest(self) -> str:
        """Collective: the digest of the parameters as they are now."""
        return param_digest(self.model, self.ctx)

    def rank_state(self) -> RankState:
        return RankState(asdict(self.state), self.loader.state_dict(), capture_rng())

    def load_rank_state(self, state: RankState, *, data_position: bool, rng: RngPolicy) -> None:
        self.state = TrainState.from_saved(state.train_state)
        self.state.attempts += 1
        if data_position:
            self.loader.load_state_dict(state.data_position)
        seed = self.cfg.train.seed
        if rng == RngPolicy.RESTORED:
            restore_rng(state.rng)
        elif rng == RngPolicy.REDERIVED:
            seed_streams(seed, self.ctx.dp_rank, step=self.state.step)
        else:
            seed_streams(seed, self.ctx.dp_rank, step=0)
