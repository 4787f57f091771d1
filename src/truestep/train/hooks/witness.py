"""A witness for graceful stops, where nothing is recomputed after the resume (the emergency save is at
the last step): before the attempt ends, record what the next step will see (the fingerprint of its
batch, of rank 0's RNG streams, of every rank's optimizer state, and the loss of a forward pass over the
batch, not applied), and after the resume check the first step against it. The optimizer fingerprint is
what sees a resume without its moments: they shape only the update, not the first forward. It is not
compared across a layout change (the shards differ by design). Taking the witness costs one forward
pass and one SHA-256 pass over the local optimizer state (`witness_s` in the event); the loader and RNG
streams are rewound after it, so the saved trajectory is untouched.

Events: `stop_witness` at the stop; after the resume `resume_verified` or `resume_diverged` with
`witness = true` (a bitwise-deterministic platform only; elsewhere `resume_unverified`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from truestep.core.names import EVENTS_FILE
from truestep.core.status import StopReason
from truestep.parallel.dist import broadcast_int
from truestep.parallel.parallelize import reshard
from truestep.telemetry.digest import optimizer_digest
from truestep.telemetry.jsonl import iter_jsonl
from truestep.telemetry.lines import same_bits
from truestep.train.hooks.base import Hook
from truestep.train.hooks.resume_check import TB_VALUE, ResumeDivergedError, bitwise_platform, say
from truestep.train.rng import capture_rng, restore_rng

if TYPE_CHECKING:
    from truestep.train.hooks.metrics import MetricsHook
    from truestep.train.trainer import StepResult, Trainer

GRACEFUL = (StopReason.PREEMPTED, StopReason.INTERRUPTED, StopReason.STOP_AT_STEP)


def _fingerprint(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def batch_fingerprint(microbatches: list[tuple[torch.Tensor, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for inputs, targets in microbatches:
        h.update(inputs.contiguous().numpy().tobytes())
        h.update(targets.contiguous().numpy().tobytes())
    return h.hexdigest()


def peek(trainer: Trainer) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], str, str]:
    """The next step's micro-batches and the fingerprints of its batch and of the RNG streams; the
    loader is rewound (nothing moves)."""
    rng = _fingerprint(capture_rng())
    cursor = trainer.loader.state_dict()
    batch = trainer.loader.next()
    trainer.loader.load_state_dict(cursor)
    return batch, batch_fingerprint(batch), rng


def forward_loss(trainer: Trainer, microbatches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Collective. The global loss the next step will log, computed as train_step computes it (train
    mode, same RNG draws), without gradients or an update; the RNG streams are put back afterwards."""
    saved = capture_rng()
    trainer.model.train()
    total = torch.zeros((), dtype=torch.float32, device=trainer.ctx.device)
    with torch.no_grad():
        for inputs, targets in microbatches:
            logits = trainer.model(inputs.to(trainer.ctx.device))
            total += F.cross_entropy(logits.flatten(0, 1), targets.to(trainer.ctx.device).flatten())
    reshard(trainer.model)  # a forward without backward leaves the FSDP2 root gathered
    loss = total / len(microbatches)
    if trainer.ctx.distributed and trainer.ctx.dp > 1:
        dist.all_reduce(loss, op=dist.ReduceOp.SUM, group=trainer.ctx.dp_group())
        loss /= trainer.ctx.dp
    restore_rng(saved)
    return float(loss.item())


class WitnessHook(Hook):
    def __init__(self, metrics: MetricsHook, layout_changed: Callable[[], bool] = lambda: False) -> None:
        self.metrics = metrics
        self.layout_changed = layout_changed
        self.expected: dict[str, Any] | None = None
        self.active = False
        """A witness of the restored step exists (known on every rank): the resume is judged here."""
        self.seen: dict[str, str] = {}

    def on_start(self, trainer: Trainer) -> None:
        """After the restore: find the witness of the restored step and fingerprint what the first step
        will see, before it draws anything."""
        if not trainer.cfg.resilience.resume_check or trainer.state.attempts <= 1:
            return
        found = 0
        if trainer.ctx.is_main:
            try:
                self.expected = _witness_of(trainer)
            except (OSError, UnicodeDecodeError, ValueError) as err:
                trainer.logs.event("resume_unverified", reason=f"cannot read the stop witness: {err}")
            found = int(self.expected is not None)
        self.active = bool(broadcast_int(found, trainer.ctx))
        if self.active:
            _, batch, rng = peek(trainer)
            moments = optimizer_digest(trainer.model, trainer.optimizer, trainer.ctx)
            self.seen = {"batch_fingerprint": batch, "rng_fingerprint": rng, "optimizer_fingerprint": moments}

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        if not self.active:
            return
        self.active = False
        flagged = 0
        if self.expected is not None:
            flagged = int(self._judge(trainer, result))
        if broadcast_int(flagged, trainer.ctx) and trainer.cfg.resilience.on_resume_divergence == "stop":
            raise ResumeDivergedError(
                f"the resume differs from the stop witness at step {trainer.state.step} "
                '(resilience.on_resume_divergence = "stop"): see the resume_diverged event'
            )

    def _judge(self, trainer: Trainer, result: StepResult) -> bool:
        want = self.expected
        assert want is not None
        got = {**self.seen, "loss": result.loss}
        compared = ["batch_fingerprint", "rng_fingerprint"]
        if "optimizer_fingerprint" in want and not self.layout_changed():
            compared.append("optimizer_fingerprint")
        differs = [k for k in compared if want.get(k) != got[k]]
        bitwise = bitwise_platform(trainer, False)
        loss_equal = isinstance(want.get("loss"), float) and same_bits(want["loss"], result.loss)
        if not loss_equal and bitwise:
            differs.append("loss")
        dloss = abs(result.loss - want["loss"]) if isinstance(want.get("loss"), float) else float("inf")
        facts = {"witness": True, "restored_step": trainer.state.step - 1, "first_step": trainer.state.step}
        facts.update(fields=differs, dloss=dloss, logged={k: want.get(k) for k in got}, recomputed=got)
        step = trainer.state.step
        if differs:
            verdict, line = (
                "diverged",
                f"resume DIVERGED from the stop witness at step {step}: {', '.join(differs)} differ (|dloss| {dloss:.3g})",
            )
        elif bitwise:
            verdict, line = "verified", f"resume verified against the stop witness: step {step} bit for bit"
        else:
            verdict = "unverified"
            line = f"resume unverified: batch and RNG match the stop witness; |dloss| {dloss:.3g} on a noisy platform"
        trainer.logs.event(f"resume_{verdict}", **facts)
        say(line)
        tb = self.metrics.tensorboard
        if tb is not None:
            tb.scalar("resume/self_check", TB_VALUE[verdict], step)
        return bool(differs)

    def on_end(self, trainer: Trainer) -> None:
        """Runs after the checkpoint hook's save: the witness of the step the resume will start with."""
        reason, t = trainer.stop_reason, trainer.cfg
        if reason not in GRACEFUL or not t.resilience.resume_check or trainer.state.step >= t.train.max_steps:
            return
        started = time.perf_counter()
        batch, batch_fp, rng_fp = peek(trainer)
        loss = forward_loss(trainer, batch)
        moments = optimizer_digest(trainer.model, trainer.optimizer, trainer.ctx)
        trainer.logs.event(
            "stop_witness",
            step=trainer.state.step,
            loss=loss,
            batch_fingerprint=batch_fp,
            rng_fingerprint=rng_fp,
            optimizer_fingerprint=moments,
            witness_s=time.perf_counter() - started,
        )


def _witness_of(trainer: Trainer) -> dict[str, Any] | None:
    """The latest earlier attempt's witness of the restored step."""
    found = None
    for e in iter_jsonl(trainer.run_dir / EVENTS_FILE):
        when = e.get("attempt")
        if (
            e.get("event") == "stop_witness"
            and e.get("step") == trainer.state.step
            and isinstance(when, int)
            and when < trainer.logs.attempt
        ):
            found = e
    return found
