"""One interface for every way a resume checks itself (`Evidence`), and two of them: the restored-digest
finding of the restore itself (`DigestEvidence`) and the replay of the steps the fault lost
(`ReplayEvidence`); the stop witness is witness.py.

Each piece of evidence is driven by the self-check hook at the same moments on every rank (its collective
parts run everywhere; rank 0 reads the logs and compares), tells every rank whether a step flags the
resume (a bool, agreed), and hands rank 0 what it saw (`Seen`) for the judge (judge.py), which alone
decides what the resume is called.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from truestep.checkpoint.restored import DigestCheck, Restored
from truestep.core.names import METRICS_FILE
from truestep.parallel.dist import broadcast_choice, broadcast_ints
from truestep.telemetry.jsonl import iter_jsonl
from truestep.train.hooks.metrics import step_fields
from truestep.train.selfcheck.replay import Mismatch, ReplayCheck, Verdict, prefault_window

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult
    from truestep.train.view import StepView


@dataclass(frozen=True)
class Seen:
    """What one piece of evidence saw of a resume (rank 0)."""

    name: str
    verdict: Verdict
    """Its own finding: VERIFIED (it compared, everything matched conclusively), UNVERIFIED, DIVERGED."""
    judged: bool
    """It compared anything at all."""
    covers_optimizer: bool
    """What it compared shows the restored optimizer state (two replayed steps, a witness fingerprint)."""
    step: int
    """The step its finding is about (the first flagged step, or the last compared)."""
    facts: dict[str, Any]
    line: str
    """Its console line (without the "truestep train: " prefix)."""
    reasons: tuple[str, ...] = field(default=())
    """Why it could not conclude, when unverified."""


class Evidence(Protocol):
    name: str

    def on_start(self, view: StepView, restored: Restored) -> None:
        """Collective, before the first step draws anything."""
        ...

    def after_step(self, view: StepView, result: StepResult) -> bool:
        """Collective. True on every rank when this step flags the resume."""
        ...

    @property
    def done(self) -> bool:
        """Nothing more to compare (the same on every rank)."""
        ...

    def seen(self) -> Seen | None:
        """Rank 0: what it saw; None on the other ranks."""
        ...


def bitwise_platform(view: StepView, layout_changed: bool) -> bool:
    """Whether a recomputed step must be bit-identical: deterministic algorithms on CPU, no emulated
    reduction noise, and the layout of the saving run (another layout reduces in another order)."""
    t = view.cfg.train
    return (
        t.deterministic
        and view.ctx.device.type == "cpu"
        and not t.emulate_nondeterminism
        and not layout_changed
    )


class DigestEvidence:
    """The restore's own check: weights whose digest differs from the saved one were kept (only the naive
    ablation keeps them) -- the resume is flagged at its first step, before anything is compared."""

    name = "digest"

    def __init__(self) -> None:
        self.restored: Restored | None = None
        self.bitwise = True
        self.floor = 0.0
        self._done = False

    def on_start(self, view: StepView, restored: Restored) -> None:
        self.restored = restored
        self.bitwise = bitwise_platform(view, restored.layout_changed)
        self.floor = view.cfg.resilience.resume_check_floor

    def after_step(self, view: StepView, result: StepResult) -> bool:
        self._done = True
        return self.restored is not None and self.restored.digest == DigestCheck.DIFFERS_KEPT

    @property
    def done(self) -> bool:
        return self._done

    def seen(self) -> Seen | None:
        restored = self.restored
        if restored is None or restored.digest != DigestCheck.DIFFERS_KEPT:
            return None
        check = ReplayCheck(restored.step, {}, self.bitwise, self.floor)
        check.mismatch = Mismatch(
            restored.step + 1,
            ("param_digest",),
            {},
            {},
            "the restored weights: they are not the ones saved (checkpoint.atomic_commit=false)",
        )
        return Seen(
            self.name, Verdict.DIVERGED, True, False, restored.step + 1, check.facts(), check.summary()
        )


class WindowState(enum.Enum):
    READ = "read"
    UNREADABLE = "unreadable"


class ReplayEvidence:
    """The steps between the restored step and the fault, recomputed and compared with their pre-fault
    metrics lines (replay.py)."""

    name = "replay"

    def __init__(self) -> None:
        self.check: ReplayCheck | None = None
        self.reason = ""
        self.first_step = 0
        self.window_len = 0
        self._done = False

    def on_start(self, view: StepView, restored: Restored) -> None:
        self.first_step = restored.step + 1
        state, length = WindowState.READ, 0
        if view.ctx.is_main:
            try:
                window = prefault_window(
                    iter_jsonl(view.run_dir / METRICS_FILE), restored.step, view.logs.attempt
                )
            except (OSError, UnicodeDecodeError, ValueError) as err:
                window, state = {}, WindowState.UNREADABLE
                self.reason = f"cannot read the pre-fault lines: {err}"
            bitwise = bitwise_platform(view, restored.layout_changed)
            self.check = ReplayCheck(restored.step, window, bitwise, view.cfg.resilience.resume_check_floor)
            length = len(window)
        state = broadcast_choice(state, view.ctx)
        self.window_len = broadcast_ints([length], view.ctx)[0]
        self._done = state != WindowState.READ or self.window_len == 0

    def after_step(self, view: StepView, result: StepResult) -> bool:
        if self._done:
            return False
        step = view.step
        flagged = 0
        if self.check is not None and self.check.pending(step):
            flagged = int(self.check.compare(step, step_fields(view, result)) is not None)
        flagged = broadcast_ints([flagged], view.ctx)[0]
        if flagged or step >= self.first_step + self.window_len - 1:
            self._done = True
        return bool(flagged)

    @property
    def done(self) -> bool:
        return self._done

    def seen(self) -> Seen | None:
        check = self.check
        if check is None:
            return None
        verdict, why = check.verdict()
        facts = check.facts()
        if self.reason:
            facts["reason"] = self.reason
            return Seen(self.name, Verdict.UNVERIFIED, False, False, check.restored_step, facts,
                        f"resume unverified: {self.reason}", (self.reason,))  # fmt: skip
        step = check.mismatch.step if check.mismatch is not None else check.last_step
        covers = check.compared >= 2 and check.mismatch is None
        return Seen(self.name, verdict, check.compared > 0, covers, step, facts, check.summary(),
                    (why,) if why else ())  # fmt: skip
