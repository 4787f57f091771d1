"""Which floor repeats are independent draws of the platform's noise (analysis/floor.py).

A repeat is a draw only if its history is its own. Two failure-free same-seed runs on a nondeterministic
platform part at some early step and never meet again; a repeat that says exactly what the reference (or
another repeat) says for longer than that -- a copy with a few steps changed, a run continued from the
reference's checkpoint, a run whose first 20 steps are the reference's -- shares that history. Counted
as a draw it is "too close": its envelope is zero (or one ulp) where the other repeats differ, and the
leave-one-out statistic of every other repeat against it explodes, with the threshold of every family.

The rule, from the logs alone: for each pair of runs among the reference and the repeats, the first
step at which they say anything different (an observable of a metrics line, bit for bit, or a parameter
digest both logged at a checkpoint save). The earliest of these over all pairs is where independent runs
part on this platform. A repeat shares history with the reference, or with a repeat already counted,
when it parts from it more than `slack` steps later than that (or never), or when the two hold
bit-identical parameters at a checkpoint after that (equal logged digests; against the reference also a
zero distance in every state kind): it is not a draw, and the note says with whom and for how long.
`slack` is the envelope's look-ahead (analysis/floor.py): a repeat that parts within it contributes to
the envelope from the same steps as the others. Runs that share a deterministic start (every pair
identical for the same first steps) are all still draws.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from truestep.analysis.runlog import RunLog
from truestep.telemetry.lines import line_differences

if TYPE_CHECKING:
    from truestep.analysis.fidelity import Comparison


def first_difference(a: RunLog, b: RunLog) -> float:
    """The first step at which `a` and `b` logged something different; inf when they never did."""
    steps = set(a.final_steps) & set(b.final_steps)
    found = [s for s in steps if line_differences(a.final_steps[s], b.final_steps[s])]
    da, db = a.digests(), b.digests()
    found += [s for s in da if s in db and da[s] != db[s]]
    return float(min(found)) if found else math.inf


def same_checkpoints(a: RunLog, b: RunLog) -> list[int]:
    """Steps at which both logged the same parameter digest (identical parameters)."""
    da, db = a.digests(), b.digests()
    return sorted(s for s in da if s in db and da[s] == db[s])


def _zero_state(c: Comparison | None) -> list[int]:
    """Checkpoint steps at which a repeat's state equals the reference's in every kind, bit for bit."""
    return [d.step for d in c.state if d.totals and not d.nonzero] if c is not None else []


def independent(
    ref: RunLog, repeats: list[RunLog], comparisons: list[Comparison] | None = None, slack: int = 0
) -> tuple[list[int], list[str]]:
    """Indices of the repeats that are independent draws, and a note for each one that is not.
    `comparisons`: each repeat against the reference (their state distances count too)."""
    runs = [ref, *repeats]
    pairs = [(i, j) for i in range(len(runs)) for j in range(i + 1, len(runs))]
    parted = {(i, j): first_difference(runs[i], runs[j]) for i, j in pairs}
    earliest = min(parted.values(), default=math.inf)
    if math.isinf(earliest):
        return list(range(len(repeats))), []  # a bitwise floor: every run says the same
    limit = earliest + slack
    kept: list[int] = []
    notes = []
    for k in range(1, len(runs)):
        why = ""
        for i in [0, *kept]:
            same = same_checkpoints(runs[i], runs[k])
            if i == 0 and comparisons is not None:
                same = sorted(set(same) | set(_zero_state(comparisons[k - 1])))
            late = [s for s in same if s > limit]
            who = "the reference" if i == 0 else str(runs[i].path)
            if parted[(i, k)] > limit:
                until = (
                    "in everything both logged"
                    if math.isinf(parted[(i, k)])
                    else f"until step {int(parted[(i, k)])}"
                )
                why = f"is bit-identical to {who} {until}"
            elif late:
                why = f"holds the same parameters as {who} at checkpoint step {late[0]}"
            if why:
                break
        if why:
            notes.append(
                f"{runs[k].path} {why}, where independent runs part by step {int(earliest)}: it shares "
                "that history, not a draw"
            )
            continue
        kept.append(k)
    return [k - 1 for k in kept], notes
