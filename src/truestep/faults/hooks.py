"""Named fault points compiled into the code paths that matter, and the specs that arm them.

A spec reads `KIND:at=POINT[:step=N][:rank=R][:restart=K][:seconds=S]`, e.g.
`crash:at=save:before-marker:step=20:rank=0`. Kinds: `crash` (SIGKILL this process), `sleep` (stall for
`seconds`), `nan` (poison the loss; only at `train:loss`). `restart` (default 0) matches the supervisor's
TRUESTEP_RESTART_COUNT, so a fault fires in one attempt and the restarted job runs clean; within a
process each spec fires once.
Specs come from the env var TRUESTEP_FAULTS (';'-separated). With nothing armed, a fault point is one
dict lookup.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

ENV_VAR = "TRUESTEP_FAULTS"
POINTS = (
    "save:before-shards",
    "save:mid-shards",
    "save:after-shards",
    "save:before-manifest",
    "save:before-marker",
    "save:after-marker",
    "train:step",
    "train:loss",
)
KINDS = ("crash", "sleep", "nan")


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    at: str
    step: int | None = None
    """Only at this step (None = every time the point is reached)."""
    rank: int | None = None
    """Only on this global rank (None = every rank)."""
    restart: int = 0
    """Only in this attempt of a supervised job (TRUESTEP_RESTART_COUNT)."""
    seconds: float = 0.0
    """sleep only: how long."""


def parse_faults(text: str) -> list[FaultSpec]:
    specs = []
    for item in filter(None, (s.strip() for s in text.split(";"))):
        kind, _, rest = item.partition(":")
        if kind not in KINDS:
            raise ValueError(f"fault {item!r}: unknown kind {kind!r} (known: {', '.join(KINDS)})")
        at = next((p for p in sorted(POINTS, key=len, reverse=True) if f"at={p}" in rest), None)
        if at is None:
            raise ValueError(f"fault {item!r}: needs at=<point>, one of {', '.join(POINTS)}")
        fields = dict(f.split("=", 1) for f in rest.replace(f"at={at}", "").split(":") if f)
        unknown = set(fields) - {"step", "rank", "restart", "seconds"}
        if unknown:
            raise ValueError(f"fault {item!r}: unknown fields {sorted(unknown)}")
        if kind == "nan" and at != "train:loss":
            raise ValueError(f"fault {item!r}: nan faults go at train:loss")
        specs.append(
            FaultSpec(
                kind,
                at,
                int(fields["step"]) if "step" in fields else None,
                int(fields["rank"]) if "rank" in fields else None,
                int(fields.get("restart", 0)),
                float(fields.get("seconds", 0.0)),
            )
        )
    return specs


_ARMED: dict[str, list[FaultSpec]] = {}


def arm(specs: list[FaultSpec]) -> None:
    _ARMED.clear()
    for spec in specs:
        _ARMED.setdefault(spec.at, []).append(spec)


def armed() -> list[FaultSpec]:
    return [s for specs in _ARMED.values() for s in specs]


def _matching(name: str, step: int | None) -> list[FaultSpec]:
    """Specs that fire here now; each fires at most once per process (a replayed step runs clean)."""
    specs = _ARMED.get(name)
    if not specs:
        return []
    rank = int(os.environ.get("RANK", "0"))
    restart = int(os.environ.get("TRUESTEP_RESTART_COUNT", "0"))
    fired = [
        s
        for s in specs
        if (s.step is None or s.step == step) and (s.rank is None or s.rank == rank) and s.restart == restart
    ]
    for spec in fired:
        specs.remove(spec)
    return fired


def _announce(spec: FaultSpec, step: int | None) -> None:
    print(
        f"truestep fault: {spec.kind} at {spec.at} step={step} rank={os.environ.get('RANK', '0')} "
        f"time={time.time():.6f}",
        file=sys.stderr,
        flush=True,
    )


def fault_point(name: str, step: int | None = None) -> None:
    """Crash or stall here if a matching fault is armed."""
    for spec in _matching(name, step):
        _announce(spec, step)
        if spec.kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        elif spec.kind == "sleep":
            time.sleep(spec.seconds)


def poison_loss(step: int) -> bool:
    """True if a `nan` fault is armed for this step at train:loss."""
    matches = _matching("train:loss", step)
    for spec in matches:
        _announce(spec, step)
    return bool(matches)


arm(parse_faults(os.environ.get(ENV_VAR, "")))
