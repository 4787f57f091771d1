"""The soak's faults: a seeded Poisson process over the steps of the job, one fault per attempt.

Arrival steps: a Poisson process on (first, last] conditioned on `count` arrivals, which is `count`
sorted uniform draws (the order statistics); drawn from `random.Random(seed)`, so a seed names the
whole schedule. Each arrival gets a class; every class the supervisor survives appears at least
`count // len(CLASSES)` times, the rest are drawn at random. Fault k is armed for attempt k only
(`restart=k`, docs/faults.md), so every fault meets the job exactly once whatever its timing, and
`from=STEP` fires it at the first step >= STEP that attempt reaches (a save fault: the first save
from there on). A restore fault fires while attempt k restores: it meets the recovery of fault k-1.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from truestep.faults.spec import SAVE_PHASES

CLASSES = ("rank_kill", "rank_stop", "rank_sigterm", "preemption", "save", "restore")
"""What the supervisor survives: a rank SIGKILLed, SIGSTOPped (a hang), SIGTERMed alone; the whole job
preempted (SIGTERM to the supervisor, exit 75, relaunched like a requeue); a SIGKILL inside the commit
protocol of a save; a SIGKILL while a restarted rank restores."""
COMMIT_PHASES = ("before-manifest", "before-marker", "after-marker")
"""Phases only rank 0 reaches (it commits): a save fault there is armed on rank 0."""


@dataclass(frozen=True)
class PlannedFault:
    attempt: int
    step: int
    """The arrival step (for `restore`: the recovery it meets is the previous fault's)."""
    cls: str
    spec: str


def arrivals(seed: int, count: int, first: int, last: int) -> list[int]:
    """`count` arrival steps of a Poisson process on (first, last] given `count` arrivals, sorted."""
    rng = random.Random(seed)
    return sorted(first + 1 + int(rng.random() * (last - first)) for _ in range(count))


def classes(seed: int, count: int) -> list[str]:
    """A class per arrival: each class at least count // len(CLASSES) times, shuffled; never a restore
    fault first (attempt 0 starts fresh: there is nothing to restore)."""
    rng = random.Random(seed + 1)
    picked = [c for c in CLASSES for _ in range(count // len(CLASSES))]
    picked += [rng.choice(CLASSES) for _ in range(count - len(picked))]
    rng.shuffle(picked)
    if picked and picked[0] == "restore":
        swap = next(i for i, c in enumerate(picked) if c != "restore")
        picked[0], picked[swap] = picked[swap], picked[0]
    return picked


def spec_for(cls: str, attempt: int, step: int, rank: int, phase: str) -> str:
    tail = f"restart={attempt}"
    return {
        "rank_kill": f"kill:rank={rank}:from={step}:{tail}",
        "rank_stop": f"hang:rank={rank}:from={step}:{tail}",
        "rank_sigterm": f"term:rank={rank}:to=rank:from={step}:{tail}",
        "preemption": f"term:from={step}:{tail}",
        "save": f"crash-in-save:phase={phase}:from={step}:rank={rank}:{tail}",
        "restore": f"kill:at=restore:rank={rank}:{tail}",
    }[cls]


def plan(seed: int, count: int, steps: int, interval: int, world: int) -> list[PlannedFault]:
    """The soak's schedule: arrivals after the first commit and at least two intervals before the end
    (a save fault needs a save after its arrival), one class and one rank each."""
    if count < len(CLASSES):
        raise ValueError(f"--faults {count}: at least {len(CLASSES)}, one per class")
    first, last = interval, steps - 2 * interval
    if last - first < count:
        raise ValueError(f"{count} faults do not fit into steps {first}..{last}")
    rng = random.Random(seed + 2)
    out = []
    for attempt, (step, cls) in enumerate(
        zip(arrivals(seed, count, first, last), classes(seed, count), strict=True)
    ):
        rank, phase = rng.randrange(world), rng.choice(SAVE_PHASES)
        if cls == "save" and phase in COMMIT_PHASES:
            rank = 0
        out.append(PlannedFault(attempt, step, cls, spec_for(cls, attempt, step, rank, phase)))
    return out


def as_records(faults: list[PlannedFault]) -> list[dict]:
    return [asdict(f) for f in faults]
