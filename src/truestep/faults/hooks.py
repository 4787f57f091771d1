"""Named fault points compiled into the code paths that matter, and the specs that arm them.

A spec reads `crash:at=save:after-shards:step=20:rank=0` (fields after the kind are key=value,
separated by ':'; `at` may itself contain ':' and is matched as the longest known point name).
Specs come from the env var TRUESTEP_FAULTS (';'-separated), so a launcher can arm a child process.
With nothing armed, `fault_point` is one dict lookup.
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
)


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    """crash: SIGKILL this process at the point."""
    at: str
    """One of POINTS."""
    step: int | None = None
    """Only at this step (None = first time reached)."""
    rank: int | None = None
    """Only on this global rank (None = every rank)."""


def parse_faults(text: str) -> list[FaultSpec]:
    specs = []
    for item in filter(None, (s.strip() for s in text.split(";"))):
        kind, _, rest = item.partition(":")
        if kind != "crash":
            raise ValueError(f"fault {item!r}: unknown kind {kind!r} (known: crash)")
        at = next((p for p in sorted(POINTS, key=len, reverse=True) if f"at={p}" in rest), None)
        if at is None:
            raise ValueError(f"fault {item!r}: needs at=<point>, one of {', '.join(POINTS)}")
        fields = dict(f.split("=", 1) for f in rest.replace(f"at={at}", "").split(":") if f)
        unknown = set(fields) - {"step", "rank"}
        if unknown:
            raise ValueError(f"fault {item!r}: unknown fields {sorted(unknown)}")
        specs.append(
            FaultSpec(
                kind,
                at,
                int(fields["step"]) if "step" in fields else None,
                int(fields["rank"]) if "rank" in fields else None,
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


def fault_point(name: str, step: int | None = None) -> None:
    specs = _ARMED.get(name)
    if not specs:
        return
    rank = int(os.environ.get("RANK", "0"))
    for spec in specs:
        if (spec.step is None or spec.step == step) and (spec.rank is None or spec.rank == rank):
            print(
                f"truestep fault: {spec.kind} at {name} step={step} rank={rank} time={time.time():.6f}",
                file=sys.stderr,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)


arm(parse_faults(os.environ.get(ENV_VAR, "")))
