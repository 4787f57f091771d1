"""Declarative fault specs: parsing, validation, and randomized campaigns.

User-facing kinds (`--fault` on train/launch/experiment, or TRUESTEP_FAULTS, ';'-separated):

  kill:rank=1:step=120            SIGKILL rank 1 when it starts step 120
  kill:node=1:step=120            a node crash: SIGKILL node 1's supervisor and every rank of it
  term:step=300                   the scheduler's preemption: SIGTERM to the whole job (the supervisor)
  term:rank=1:to=rank:step=300    SIGTERM to rank 1 alone (a notice one rank saw; its peers agree on it)
  hang:rank=0:step=50             SIGSTOP rank 0 (a hang: alive but silent)
  crash-in-save:phase=after-shards[:step=N][:rank=R]   SIGKILL inside the commit protocol
  corrupt:target=latest:step=N    flip a byte in the newest committed checkpoint, then SIGKILL
  nan:step=80                     poison the loss of step 80 (non-finite update)
  slow:rank=1:factor=3            rank 1 runs every step 3x slower
  mutate:step=4                   add 1e-3 to the parameters and optimizer state of the save of step 4
                                  after the save call returned (an async write may still be reading them)
  hang:at=startup:rank=1          SIGSTOP rank 1 as it starts, before its first heartbeat
  kill:at=restore:rank=0          SIGKILL rank 0 while it restores (a checkpoint, or from memory)
  kill:at=snapshot:replicating:rank=1:step=N   SIGKILL rank 1 while its snapshot of step N is copied
                                  to its buddies (resilience.snapshot_every_steps)
  kill:at=rendezvous:rank=1       SIGKILL rank 1 as it joins the process group (its peers wait in it)
  kill:at=handoff:rank=0          SIGKILL the process the warm template forked for rank 0, before it becomes the rank
  term:at=teardown                the preemption notice, while the supervisor tears an attempt down
Any of them may use `time=SECONDS` (since the job started) or `from=N` (the first time at a step >= N,
e.g. whichever save comes next) instead of `step=N`. `restart=K` (default 0)
fires the fault only in the K-th attempt of a supervised job, so a restarted job runs clean.
Low-level forms used by tests: `crash:at=POINT`, `sleep:at=POINT:seconds=S`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from truestep.core.errors import UsageError

SAVE_PHASES = (
    "before-shards",
    "mid-shards",
    "after-shards",
    "before-manifest",
    "before-marker",
    "after-marker",
)
POINTS = (
    *(f"save:{p}" for p in SAVE_PHASES),
    "save:writing",
    "train:step",
    "train:loss",
    "startup",
    "rendezvous",
    "restore",
    "handoff",
    "teardown",
    "snapshot:replicating",
)
"""Where a fault can fire. In a rank: startup (before its first heartbeat), rendezvous (before it joins
the process group), restore, train:step/loss, save:*, snapshot:replicating (its background thread); in a process the warm template forked: handoff (before it
becomes the rank); in the supervisor: teardown (it is killing the ranks of a failed attempt)."""
KINDS = ("kill", "term", "hang", "crash-in-save", "corrupt", "nan", "slow", "crash", "sleep", "mutate")
_FIELDS = {
    "at",
    "step",
    "from",
    "rank",
    "node",
    "restart",
    "seconds",
    "time",
    "phase",
    "target",
    "factor",
    "to",
}


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    at: str
    """The fault point where it fires (derived from the kind for the user-facing kinds)."""
    step: int | None = None
    """Fire at this step (None = first time reached, or by `time`)."""
    rank: int | None = None
    """Only on this global rank (None = every rank; kill/hang/corrupt/term default to rank 0)."""
    restart: int = 0
    """Only in this attempt of a supervised job (TRUESTEP_RESTART_COUNT)."""
    seconds: float = 0.0
    """sleep: how long to stall."""
    time: float | None = None
    """Fire once this many seconds have passed since the job started."""
    factor: float = 1.0
    """slow: step-time multiplier."""
    from_step: int | None = None
    """Fire the first time the point is reached at a step >= this (e.g. whichever save comes next)."""
    node: int | None = None
    """kill: every process of this node of a multi-node job (its supervisor and ranks); its first rank
    fires it."""
    to_rank: bool = False
    """term: SIGTERM to the firing rank alone (`to=rank`) instead of the whole job (`to=job`, default)."""
    text: str = field(default="", compare=False)
    """The spec as the user wrote it (whitespace removed): re-runnable, logged with the fault."""

    def describe(self) -> str:
        return self.text


class FaultSpecError(UsageError, ValueError):
    """A fault spec that does not parse; the message names the spec and the problem."""


def _split(item: str) -> tuple[str, dict[str, str]]:
    kind, _, rest = item.partition(":")
    fields: dict[str, str] = {}
    at = next((p for p in sorted(POINTS, key=len, reverse=True) if f"at={p}" in rest), None)
    if at is not None:
        fields["at"] = at
        rest = rest.replace(f"at={at}", "")
    for part in filter(None, rest.split(":")):
        if "=" not in part:
            raise FaultSpecError(f"fault {item!r}: field {part!r} must be key=value")
        key, value = part.split("=", 1)
        fields[key] = value
    unknown = set(fields) - _FIELDS
    if unknown:
        raise FaultSpecError(f"fault {item!r}: unknown fields {sorted(unknown)}; known: {sorted(_FIELDS)}")
    return kind, fields


def _parse(item: str) -> FaultSpec:
    kind, f = _split(item)
    if kind not in KINDS:
        raise FaultSpecError(f"fault {item!r}: unknown kind {kind!r}; known: {', '.join(KINDS)}")
    step = int(f["step"]) if "step" in f else None
    when = _finite(f["time"], "time") if "time" in f else None
    rank = int(f["rank"]) if "rank" in f else None
    common = {
        "step": step,
        "time": when,
        "restart": int(f.get("restart", 0)),
        "from_step": int(f["from"]) if "from" in f else None,
    }
    if f.get("to", "job") not in ("job", "rank") or ("to" in f and kind != "term"):
        raise FaultSpecError(f"fault {item!r}: to=job|rank is for term only")
    if kind == "term":
        common["to_rank"] = f.get("to") == "rank"
    if kind in ("kill", "hang", "term") and "at" in f:
        # At a named point instead of a step: e.g. `hang:at=startup:rank=1`, before the first heartbeat;
        # `term:at=teardown`: the preemption notice reaches the supervisor while it tears an attempt down.
        return FaultSpec(kind, f["at"], rank=0 if rank is None else rank, **common)
    if "node" in f and (kind != "kill" or "rank" in f or "at" in f):
        raise FaultSpecError(
            f"fault {item!r}: node=K is for kill:node=K:step=N (a node crash), without rank/at"
        )
    if kind in ("kill", "term", "hang", "corrupt"):
        if step is None and when is None and "from" not in f:
            raise FaultSpecError(f"fault {item!r}: {kind} needs step=N, from=N or time=SECONDS")
        if "node" in f:
            return FaultSpec(kind, "train:step", node=int(f["node"]), **common)
        if kind == "corrupt" and f.get("target", "latest") != "latest":
            raise FaultSpecError(f"fault {item!r}: only target=latest is supported")
        return FaultSpec(kind, "train:step", rank=0 if rank is None else rank, **common)
    if kind == "crash-in-save":
        phase = f.get("phase", "")
        if phase not in SAVE_PHASES:
            raise FaultSpecError(f"fault {item!r}: phase must be one of {', '.join(SAVE_PHASES)}")
        return FaultSpec("crash", f"save:{phase}", rank=rank, **common)
    if kind == "mutate":
        if step is None and when is None and "from" not in f:
            raise FaultSpecError(f"fault {item!r}: mutate needs step=N, from=N or time=SECONDS")
        return FaultSpec("mutate", "save:writing", rank=rank, **common)
    if kind == "nan":
        return FaultSpec("nan", "train:loss", rank=rank, **common)
    if kind == "slow":
        factor = _finite(f.get("factor", "0"), "factor")
        if factor <= 1:
            raise FaultSpecError(f"fault {item!r}: slow needs factor > 1")
        return FaultSpec("slow", "train:step", rank=rank, factor=factor, **common)
    # Low-level forms.
    if "at" not in f:
        raise FaultSpecError(f"fault {item!r}: {kind} needs at=<point>, one of {', '.join(POINTS)}")
    return FaultSpec(kind, f["at"], rank=rank, seconds=_finite(f.get("seconds", "0"), "seconds"), **common)


def _finite(text: str, key: str) -> float:
    """A finite number (inf or nan as a factor, time or duration would end a rank in a traceback)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{key}={text} is not a finite number")
    return value


def parse_fault(item: str) -> FaultSpec:
    text = "".join(item.split())
    try:
        spec = _parse(text)
    except FaultSpecError:
        raise
    except ValueError as err:  # int()/float() of a field
        raise FaultSpecError(f"fault {item!r}: {err}") from None
    return replace(spec, text=text)


def parse_faults(text: str) -> list[FaultSpec]:
    return [parse_fault(item) for item in text.split(";") if item.strip()]


def campaign(count: int, seed: int, max_steps: int, world_size: int, interval: int) -> list[str]:
    """`count` random process-level faults, one per attempt (restart=i), at increasing steps.

    Drawn from {kill, hang, term, crash-in-save}; a crash-in-save lands on a checkpoint step.
    """
    rng = random.Random(seed)
    lo, hi = max(2, max_steps // 10), max(3, max_steps - max_steps // 10)
    steps = sorted(rng.sample(range(lo, hi), count))
    specs = []
    for restart, step in enumerate(steps):
        kind = rng.choice(["kill", "hang", "term", "crash-in-save"])
        rank = rng.randrange(world_size)
        if kind == "crash-in-save":
            save_step = max(interval, (step // max(interval, 1)) * max(interval, 1))
            phase = rng.choice(SAVE_PHASES)
            specs.append(f"crash-in-save:phase={phase}:step={save_step}:rank={rank}:restart={restart}")
        elif kind == "term":
            specs.append(f"term:step={step}:restart={restart}")
        else:
            specs.append(f"{kind}:rank={rank}:step={step}:restart={restart}")
    return specs
