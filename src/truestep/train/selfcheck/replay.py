"""The replay check: a resume after a hard failure checks itself against the steps it recomputes.

The steps between the restored checkpoint (step s) and the fault (the last step logged, f) were computed
and logged before the fault, and are computed again after the restore. On a bitwise-deterministic
platform every observable of a replayed step (loss, grad norm, learning rate, tokens seen: everything
`telemetry.lines.determined` counts) must carry the same bits as its pre-fault line; on a noisy platform
the loss must stay within a configured floor (the exact fields, lr and tokens seen, must still match).
No reference run is needed: the run is its own witness.

This module is pure (no torch, no files): which pre-fault lines make the window (`prefault_window`), and
the comparison step by step (`ReplayCheck`). `ReplayEvidence` (evidence.py) feeds it in the loop; whether
what it saw is enough to call the resume verified is the judge's (judge.py).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from truestep.telemetry.lines import determined, line_differences

NOISY_FIELDS = frozenset({"loss", "grad_norm"})
"""Observables that float reduction-order noise moves on a non-deterministic platform; every other
observable (lr, tokens seen) is computed from integers and must match exactly everywhere."""


class Verdict(enum.StrEnum):
    VERIFIED = "verified"
    """Every replayed step matched its pre-fault line (bitwise, or within the floor where noisy)."""
    UNVERIFIED = "unverified"
    """Nothing to compare, or a noisy platform without a floor: the deviation is reported, no verdict."""
    DIVERGED = "diverged"
    """A replayed step differs: the resume did not restore the trajectory."""


def prefault_window(lines: Iterable[dict[str, Any]], restored_step: int, attempt: int) -> dict[int, dict]:
    """step -> the pre-fault line to replay, for the steps after `restored_step` that earlier attempts
    logged: of a step logged more than once, the latest attempt's last line. The window is contiguous
    from restored_step + 1 and ends before the first missing step, and before the first line whose loss
    or grad norm is not finite (the NaN guard skipped that update, so later steps follow another path)."""
    latest: dict[int, tuple[int, dict[str, Any]]] = {}
    for line in lines:
        step, when = line.get("step"), line.get("attempt")
        if not _is_int(step) or not _is_int(when) or when >= attempt or step <= restored_step:
            continue
        held = latest.get(step)
        if held is None or when >= held[0]:
            latest[step] = (when, line)
    window: dict[int, dict] = {}
    step = restored_step + 1
    while step in latest:
        line = latest[step][1]
        if not all(_finite_number(line.get(k)) for k in NOISY_FIELDS):
            break
        window[step] = line
        step += 1
    return window


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Mismatch:
    """The first replayed step that flags the resume."""

    step: int
    fields: tuple[str, ...]
    """The observables that differ (bitwise, or beyond the floor for the loss)."""
    logged: dict[str, float | int]
    """The pre-fault line's observables."""
    recomputed: dict[str, float | int]
    """The replayed step's observables."""
    points_at: str
    """What the difference points at, from which fields differ and at which step."""


@dataclass
class ReplayCheck:
    """The comparison of one resume's replayed steps with their pre-fault lines."""

    restored_step: int
    window: dict[int, dict]
    """step -> pre-fault line (`prefault_window`)."""
    bitwise: bool
    """The platform is bitwise-deterministic: any bit that differs flags the resume."""
    floor: float = 0.0
    """Noisy platform: the largest |loss difference| that still counts as the same trajectory; 0 = none."""
    compared: int = 0
    max_dloss: float = 0.0
    max_dgrad_norm: float = 0.0
    bitwise_equal: int = 0
    mismatch: Mismatch | None = None
    deviations: list[str] = field(default_factory=list)
    """Steps whose bits differ without flagging the resume (noisy platform), as `step:fields`."""

    @property
    def last_step(self) -> int:
        """The last step to compare (f); restored_step when there is nothing to replay."""
        return max(self.window, default=self.restored_step)

    def pending(self, step: int) -> bool:
        """This step is to be compared (in the window, and nothing has flagged the resume yet)."""
        return self.mismatch is None and step in self.window

    def compare(self, step: int, recomputed: dict[str, Any]) -> Mismatch | None:
        """Compare a replayed step with its pre-fault line; the mismatch if this step flags the resume."""
        logged = self.window[step]
        differs = line_differences(logged, recomputed)
        self.compared += 1
        want, got = determined(logged), determined(recomputed)
        dloss = _abs_diff(want.get("loss"), got.get("loss"))
        self.max_dloss = max(self.max_dloss, dloss)
        self.max_dgrad_norm = max(self.max_dgrad_norm, _abs_diff(want.get("grad_norm"), got.get("grad_norm")))
        if not differs:
            self.bitwise_equal += 1
            return None
        flagged = list(differs)
        if not self.bitwise:
            flagged = [k for k in differs if k not in NOISY_FIELDS]
            if self.floor > 0 and dloss > self.floor:
                flagged.append("loss")
        if not flagged:
            self.deviations.append(f"{step}:{','.join(differs)}")
            return None
        self.mismatch = Mismatch(step, tuple(sorted(flagged)), want, got, self._points_at(step, flagged))
        return self.mismatch

    def _points_at(self, step: int, fields: list[str]) -> str:
        if "tokens_seen" in fields:
            return "the restored step and token counters (train state)"
        if "lr" in fields:
            return "the restored step counter (the learning-rate schedule reads it)"
        if step == self.restored_step + 1:
            return "what the first replayed step reads: the restored weights, data position or RNG streams"
        return (
            f"the first update after the restore (steps {self.restored_step + 1}..{step - 1} matched): "
            "the optimizer state, or state first read after that step"
        )

    def verdict(self) -> tuple[Verdict, str]:
        """The verdict and, for an unverified one, why."""
        if self.mismatch is not None:
            return Verdict.DIVERGED, ""
        if self.compared == 0:
            return Verdict.UNVERIFIED, "no pre-fault step to replay"
        if self.bitwise or self.floor > 0:
            return Verdict.VERIFIED, ""
        return Verdict.UNVERIFIED, "platform not bitwise-deterministic and no resilience.resume_check_floor"

    def facts(self) -> dict[str, Any]:
        """The numbers for the event log."""
        verdict, reason = self.verdict()
        facts: dict[str, Any] = {
            "restored_step": self.restored_step,
            "last_prefault_step": self.last_step,
            "steps_compared": self.compared,
            "steps_bitwise_equal": self.bitwise_equal,
            "max_dloss": self.max_dloss,
            "max_dgrad_norm": self.max_dgrad_norm,
            "bitwise_platform": self.bitwise,
            "floor": self.floor,
        }
        if reason:
            facts["reason"] = reason
        if self.deviations:
            facts["deviations"] = self.deviations[:20]
        if self.mismatch is not None:
            m = self.mismatch
            facts.update(
                first_step=m.step,
                fields=list(m.fields),
                logged=m.logged,
                recomputed=m.recomputed,
                points_at=m.points_at,
            )
            facts["dloss"] = _abs_diff(m.logged.get("loss"), m.recomputed.get("loss"))
            facts["dgrad_norm"] = _abs_diff(m.logged.get("grad_norm"), m.recomputed.get("grad_norm"))
        return facts

    def summary(self) -> str:
        """One console line."""
        verdict, reason = self.verdict()
        s, f = self.restored_step, self.last_step
        if verdict == Verdict.VERIFIED:
            how = "bit for bit" if self.bitwise else f"within the floor {self.floor:g}"
            return f"resume verified: steps {s + 1}..{f} replayed {how} (restored from step {s})"
        if verdict == Verdict.UNVERIFIED:
            return (
                f"resume unverified: {reason} (restored from step {s}; {self.compared} steps compared, "
                f"max |dloss| {self.max_dloss:.3g})"
            )
        m = self.mismatch
        assert m is not None
        dloss = _abs_diff(m.logged.get("loss"), m.recomputed.get("loss"))
        return (
            f"resume DIVERGED at step {m.step} (restored from step {s}): {', '.join(m.fields)} differ "
            f"(|dloss| {dloss:.3g}); points at {m.points_at}"
        )


def _abs_diff(a: Any, b: Any) -> float:
    if not _finite_number(a) or not _finite_number(b):
        return 0.0 if a == b else math.inf
    return abs(float(a) - float(b))
