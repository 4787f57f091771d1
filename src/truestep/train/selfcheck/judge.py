"""What a resume is called, from what its evidence saw: the one rule (rank 0).

- `diverged`: a piece of evidence flagged it (the earliest step wins), and the config is the saving run's.
- `verified`: something was compared and matched conclusively (bit for bit, or within the configured
  floor), the config is unchanged, and what was compared covers every restored part of the state. The
  optimizer moments shape only the next update: one replayed step cannot show them; two replayed steps,
  a stop witness's optimizer fingerprint, or a restore that proved the optimizer state by its digest can.
- `unverified` otherwise, with every reason said: nothing to compare, a noisy platform without a floor, a
  layout change, an allowed config change (never "bit for bit", never "diverged": the trajectory is not
  expected to match), evidence that cannot cover the optimizer state, a stop witness that was expected
  and is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from truestep.checkpoint.restored import DigestCheck, Restored
from truestep.train.selfcheck.evidence import Seen
from truestep.train.selfcheck.replay import Verdict

ONE_STEP = (
    "one replayed step cannot show the restored optimizer state (it shapes the next update only), and no "
    "stop witness or optimizer digest covers it"
)


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    facts: dict[str, Any]
    line: str
    step: int


def judge(restored: Restored, seen: list[Seen]) -> Judgement:
    changed = list(restored.config_differences)
    flagged = sorted((s for s in seen if s.verdict == Verdict.DIVERGED), key=lambda s: s.step)
    if flagged and not changed:
        first = flagged[0]
        return Judgement(Verdict.DIVERGED, dict(first.facts), _noted(first.line, restored), first.step)
    judged = [s for s in seen if s.judged]
    primary = next((s for s in judged if s.name != "digest"), None) or next(iter(judged or seen), None)
    reasons: list[str] = []
    if changed:
        differs = sorted({f for s in flagged for f in s.facts.get("fields", [])})
        what = f"; differs in {', '.join(differs)}" if differs else ""
        reasons.append(
            f"the config changed at the resume ({'; '.join(changed)}): the trajectory is not expected to "
            f"match the saving run's{what}"
        )
    if not judged:
        reasons.extend(r for s in seen for r in s.reasons)
    else:
        reasons.extend(r for s in judged if s.verdict != Verdict.VERIFIED for r in s.reasons)
    conclusive = any(s.verdict == Verdict.VERIFIED for s in judged)
    covered = any(s.covers_optimizer for s in seen) or restored.optimizer_proven
    if conclusive and not covered and not changed:
        reasons.append(ONE_STEP)
    facts = dict(primary.facts) if primary is not None else {"restored_step": restored.step}
    step = primary.step if primary is not None else restored.step + 1
    if conclusive and not reasons:
        assert primary is not None
        return Judgement(Verdict.VERIFIED, facts, _noted(primary.line, restored), step)
    facts["reason"] = "; ".join(dict.fromkeys(reasons)) or "nothing was compared"
    return Judgement(Verdict.UNVERIFIED, facts, _noted(_unverified_line(facts, restored), restored), step)


def _unverified_line(facts: dict[str, Any], restored: Restored) -> str:
    compared = facts.get("steps_compared")
    tail = f"restored from step {restored.step}"
    if isinstance(compared, int):
        tail += f"; {compared} steps compared, max |dloss| {facts.get('max_dloss', 0.0):.3g}"
    return f"resume unverified: {facts['reason']} ({tail})"


def _noted(line: str, restored: Restored) -> str:
    """What the resume could not be checked against, said in its line."""
    if restored.digest == DigestCheck.NOT_RECORDED:
        return f"{line}; the checkpoint holds no parameter digest (not checked)"
    return line
