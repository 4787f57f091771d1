"""Where this process's start-up went, phase by phase, for the `run_start` event (`startup_phases`).

The phases, in seconds (0 for one that did not happen in this start):

- `import`: from truestep's import (the process's start as a rank; for a forked rank, its fork) to the
  process group's rendezvous: Python loading torch and truestep;
- `build`: the Trainer's construction: the model allocated (never initialized there), optimizer, data;
- `init`: the fresh start's random initialization (`Trainer.initialize`): 0 on a resume;
- `verify`: verifying checkpoints before anything is loaded (`checkpoint.integrity`, on the rank that
  verifies: rank 0 at a resume); for a restore from peers' memory (checkpoint/memory/restore.py), the
  inventory, fetching this rank's snapshot copy (from a buddy over the process group when its own memory
  was lost) and its SHA-256 check, and the restored model's digest check after the load;
- `load`: the loads themselves (DCP read, hashing each item as it is read, and the copy into the model and
  optimizer; from memory, the copy of the verified snapshot into the model and optimizer). A memory
  restore is a load like a disk one: the weights are loaded, `init` stays 0.

Each is added to where its code runs (the rooms that own it); `begin` resets them at the start of a
run, and the trainer reads them once, when it logs `run_start`. Process-global, like the hash counters:
one rank per process (a rank run in-process begins its own).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("import", "build", "init", "verify", "load")

_lock = threading.Lock()
_seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)


def begin(import_s: float) -> None:
    """A run starts: every phase back to 0, and the import's duration as measured by the caller."""
    with _lock:
        _seconds.update(dict.fromkeys(PHASES, 0.0))
        _seconds["import"] = max(0.0, import_s)


def add(phase: str, seconds: float) -> None:
    if phase not in PHASES:
        raise ValueError(f"unknown start-up phase {phase!r}")
    with _lock:
        _seconds[phase] += seconds


_inside = threading.local()


@contextmanager
def timed(phase: str) -> Iterator[None]:
    """Add the time the block takes to `phase` (also when it raises: a failed load took its time too).
    A block inside another timed block of this thread adds nothing: its time is counted once, by the
    outer one (the memory restore's load phase holds the trainer's own timed copies)."""
    if phase not in PHASES:
        raise ValueError(f"unknown start-up phase {phase!r}")
    if getattr(_inside, "phase", None) is not None:
        yield
        return
    _inside.phase = phase
    started = time.perf_counter()
    try:
        yield
    finally:
        _inside.phase = None
        add(phase, time.perf_counter() - started)


def snapshot() -> dict[str, float]:
    with _lock:
        return {phase: round(_seconds[phase], 6) for phase in PHASES}
