"""The stop witness, for graceful stops, where nothing is recomputed after the resume (the emergency save is
at the last step): before the attempt ends, record what the next step will see (`StopWitnessHook`), and
after the resume judge the first step against it (`WitnessEvidence`).

What it records (`stop_witness` event): the step, the next step's learning rate, the tokens seen, the data
position, the fingerprints of every rank's batch and RNG streams (gathered), of every rank's optimizer
state, and the loss of a forward pass over the batch, not applied. The optimizer fingerprint is what sees
a resume without its moments: they shape only the update, not the first forward. The loader and RNG
streams are rewound after it, so the saved trajectory is untouched; it costs one forward pass and one
SHA-256 pass over the local optimizer state (`witness_s`).

On the saving layout every field is compared (the loss bit for bit on a bitwise platform). On another
layout only what is layout-invariant is: the data position, the learning rate and the tokens seen; the
batches, RNG streams and optimizer shards differ by design there, so such a resume is never called
diverged when all is well, nor verified.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

import torch

from truestep.checkpoint.restored import GRACEFUL_SAVE_REASONS, Restored
from truestep.core.names import EVENTS_FILE
from truestep.parallel.dist import broadcast_ints
from truestep.parallel.parallelize import reshard
from truestep.telemetry.digest import gather_digest, optimizer_digest
from truestep.telemetry.jsonl import iter_jsonl
from truestep.telemetry.lines import same_bits
from truestep.train.hooks.base import Hook, Slot
from truestep.train.loss import StepLoss
from truestep.train.rng import capture_rng, restore_rng
from truestep.train.schedule import lr_at
from truestep.train.selfcheck.evidence import Seen, bitwise_platform
from truestep.train.selfcheck.replay import Verdict

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult
    from truestep.train.view import Batch, StepView

SAME_LAYOUT_FIELDS = ("batch_fingerprint", "rng_fingerprint", "optimizer_fingerprint", "lr", "tokens_seen")
"""Compared on the saving layout (the batch fingerprint covers the data position there)."""
LAYOUT_INVARIANT_FIELDS = ("data_position", "lr", "tokens_seen")
"""Compared on another layout: what a correct resume keeps whatever the layout."""


def _fingerprint(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def batch_fingerprint(microbatches: Batch) -> bytes:
    h = hashlib.sha256()
    for inputs, targets in microbatches:
        h.update(inputs.contiguous().numpy().tobytes())
        h.update(targets.contiguous().numpy().tobytes())
    return h.digest()


def fingerprints(view: StepView) -> dict[str, Any]:
    """Collective. What the next step will see, fingerprinted on every rank and gathered: its batch, the
    RNG streams, the optimizer state; and the layout-invariant data position."""
    batch = view.peek_batch()
    rng = hashlib.sha256(json.dumps(capture_rng(), sort_keys=True).encode()).digest()
    return {
        "batch_fingerprint": gather_digest(batch_fingerprint(batch), view.ctx),
        "rng_fingerprint": gather_digest(rng, view.ctx),
        "optimizer_fingerprint": optimizer_digest(view.model, view.optimizer, view.ctx),
        "data_position": _fingerprint(view.data_position()),
    }


def forward_loss(view: StepView, microbatches: Batch) -> float:
    """Collective. The global loss the next step will log, computed as train_step computes it (train
    mode, same RNG draws), without gradients or an update; the RNG streams are put back afterwards."""
    saved = capture_rng()
    model, ctx = view.model, view.ctx
    model.train()
    losses = StepLoss(microbatches, ctx, view.loss_masked)
    total = torch.zeros((), dtype=torch.float32, device=ctx.device)
    with torch.no_grad():
        for inputs, targets in microbatches:
            logits = model(inputs.to(ctx.device))
            total += losses.microbatch(logits, targets.to(ctx.device))
    reshard(model)  # a forward without backward leaves the FSDP2 root gathered
    loss = losses.global_loss(total)
    restore_rng(saved)
    return float(loss.item())


class StopWitnessHook(Hook):
    """Records the witness of a graceful stop, after the final save (its slot)."""

    slot = Slot.WITNESS

    def on_end(self, view: StepView) -> None:
        reason, cfg = view.stop_reason, view.cfg
        graceful = reason is not None and str(reason) in GRACEFUL_SAVE_REASONS
        if not graceful or not cfg.resilience.resume_check or view.step >= cfg.train.max_steps:
            return
        started = time.perf_counter()
        seen = fingerprints(view)
        loss = forward_loss(view, view.peek_batch())
        view.logs.event(
            "stop_witness",
            step=view.step,
            loss=loss,
            lr=lr_at(view.step, cfg),
            tokens_seen=view.state.tokens_seen,
            layout=view.ctx.layout(),
            **seen,
            witness_s=time.perf_counter() - started,
        )


def witness_of(view: StepView, step: int) -> dict[str, Any] | None:
    """The latest earlier attempt's witness of `step` (rank 0 reads the event log)."""
    found = None
    for e in iter_jsonl(view.run_dir / EVENTS_FILE):
        when = e.get("attempt")
        earlier = isinstance(when, int) and when < view.logs.attempt
        if e.get("event") == "stop_witness" and e.get("step") == step and earlier:
            found = e
    return found


class WitnessEvidence:
    name = "witness"

    def __init__(self) -> None:
        self.expected: dict[str, Any] | None = None
        self.active = False
        """A witness of the restored step exists (known on every rank): the first step is judged."""
        self.missing = ""
        """Rank 0: why there is no witness to judge the first step by."""
        self.seen_now: dict[str, Any] = {}
        self.finding: Seen | None = None
        self.restored: Restored | None = None

    def on_start(self, view: StepView, restored: Restored) -> None:
        """After the restore, before the first step draws anything: find the witness, fingerprint."""
        self.restored = restored
        found = 0
        if view.ctx.is_main:
            try:
                self.expected = witness_of(view, restored.step)
            except (OSError, UnicodeDecodeError, ValueError) as err:
                self.missing = f"cannot read the stop witness: {err}"
            found = int(self.expected is not None)
            if not found and not self.missing:  # said when nothing else is compared (judge.py)
                why = (
                    "a graceful stop cut short, or events.jsonl lost"
                    if restored.graceful
                    else "no graceful stop"
                )
                self.missing = f"no stop witness of step {restored.step} was recorded ({why})"
        self.active = bool(broadcast_ints([found], view.ctx)[0])
        if self.active:  # what the first step starts from: its lr is the result's, its tokens are these
            self.seen_now = {**fingerprints(view), "tokens_seen": view.state.tokens_seen}

    def after_step(self, view: StepView, result: StepResult) -> bool:
        if not self.active:
            return False
        self.active = False
        flagged = 0
        if self.expected is not None:
            self.finding = self._judge(view, result)
            flagged = int(self.finding.verdict == Verdict.DIVERGED)
        return bool(broadcast_ints([flagged], view.ctx)[0])

    @property
    def done(self) -> bool:
        return not self.active

    def seen(self) -> Seen | None:
        if self.finding is not None:
            return self.finding
        if self.missing:
            step = self.restored.step if self.restored is not None else 0
            return Seen(self.name, Verdict.UNVERIFIED, False, False, step, {"witness": False},
                        f"resume unverified: {self.missing}", (self.missing,))  # fmt: skip
        return None

    def _judge(self, view: StepView, result: StepResult) -> Seen:
        want = self.expected
        restored = self.restored
        assert want is not None and restored is not None
        got = {**self.seen_now, "lr": result.lr, "loss": result.loss}
        layout_changed = restored.layout_changed
        fields = LAYOUT_INVARIANT_FIELDS if layout_changed else SAME_LAYOUT_FIELDS
        compared = [k for k in fields if k in want]  # a witness from an older version records fewer
        differs = [k for k in compared if want[k] != got[k]]
        bitwise = bitwise_platform(view, layout_changed)
        loss_equal = isinstance(want.get("loss"), float) and same_bits(want["loss"], result.loss)
        if not loss_equal and bitwise:
            differs.append("loss")
        dloss = abs(result.loss - want["loss"]) if isinstance(want.get("loss"), float) else float("inf")
        step = view.step
        facts = {"witness": True, "restored_step": restored.step, "first_step": step}
        facts.update(fields=differs, dloss=dloss, logged={k: want.get(k) for k in got}, recomputed=got)
        facts["compared"] = compared
        covers = "optimizer_fingerprint" in compared and not differs
        if differs:
            line = f"resume DIVERGED from the stop witness at step {step}: {', '.join(differs)} differ (|dloss| {dloss:.3g})"
            return Seen(self.name, Verdict.DIVERGED, True, False, step, facts, line)
        if layout_changed:
            why = (
                "the layout changed: the data position, learning rate and tokens seen match the stop witness; "
                "batches, RNG streams, optimizer shards and the loss are layout-dependent"
            )
            return Seen(
                self.name, Verdict.UNVERIFIED, True, False, step, facts, f"resume unverified: {why}", (why,)
            )
        if bitwise:
            line = f"resume verified against the stop witness: step {step} bit for bit"
            return Seen(self.name, Verdict.VERIFIED, True, covers, step, facts, line)
        why = f"batch and RNG match the stop witness; |dloss| {dloss:.3g} on a noisy platform"
        return Seen(
            self.name, Verdict.UNVERIFIED, True, covers, step, facts, f"resume unverified: {why}", (why,)
        )
