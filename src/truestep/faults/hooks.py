"""Fault points compiled into the code paths that matter, and what an armed fault does there.

Inert unless armed: with no spec, `fault_point` is one dict lookup. Specs are armed from the env var
TRUESTEP_FAULTS at import (that is how `truestep launch` and `experiment` arm child ranks) or by `arm`.
Every fault that fires is announced on stderr and, when a run directory is known, written to its
events.jsonl as `fault_injected` with its wall-clock time: detection latency and MTTR are measured from
the true fault time.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from truestep.faults.spec import POINTS, FaultSpec, parse_faults

ENV_VAR = "TRUESTEP_FAULTS"
JOB_START_ENV = "TRUESTEP_JOB_START"
SUPERVISOR_ENV = "TRUESTEP_SUPERVISOR_PID"

_ARMED: dict[str, list[FaultSpec]] = {}
_CONTEXT: dict[str, Path] = {}
_PROCESS_START = time.time()
_last_step_mark: list[float] = []

__all__ = ["ENV_VAR", "POINTS", "FaultSpec", "arm", "armed", "fault_point", "parse_faults", "poison_loss"]


def arm(specs: list[FaultSpec]) -> None:
    _ARMED.clear()
    for spec in specs:
        _ARMED.setdefault(spec.at, []).append(spec)


def armed() -> list[FaultSpec]:
    return [s for specs in _ARMED.values() for s in specs]


def set_context(run_dir: Path | None = None, checkpoint_root: Path | None = None) -> None:
    """Where to log fired faults and which checkpoints `corrupt` targets (set by the trainer)."""
    if run_dir is not None:
        _CONTEXT["run_dir"] = run_dir
    if checkpoint_root is not None:
        _CONTEXT["checkpoint_root"] = checkpoint_root


def _elapsed() -> float:
    return time.time() - float(os.environ.get(JOB_START_ENV, _PROCESS_START))


def _due(spec: FaultSpec, step: int | None, rank: int, restart: int) -> bool:
    if spec.restart != restart or (spec.rank is not None and spec.rank != rank):
        return False
    if spec.time is not None:
        return _elapsed() >= spec.time
    if spec.from_step is not None:
        return step is not None and step >= spec.from_step
    return spec.step is None or spec.step == step


def _fire(name: str, step: int | None) -> list[FaultSpec]:
    """Specs due here now. Each fires once per process (a replayed step runs clean), except `slow`."""
    specs = _ARMED.get(name)
    if not specs:
        return []
    rank = int(os.environ.get("RANK", "0"))
    restart = int(os.environ.get("TRUESTEP_RESTART_COUNT", "0"))
    fired = [s for s in specs if _due(s, step, rank, restart)]
    for spec in fired:
        if spec.kind != "slow":
            specs.remove(spec)
            _announce(spec, name, step, rank)
    return fired


def _announce(spec: FaultSpec, name: str, step: int | None, rank: int) -> None:
    now = time.time()
    print(
        f"truestep fault: {spec.kind} at {name} step={step} rank={rank} time={now:.6f}",
        file=sys.stderr,
        flush=True,
    )
    run_dir = _CONTEXT.get("run_dir")
    if run_dir is not None:
        record = {"time": now, "source": "fault", "event": "fault_injected", "kind": spec.kind}
        record.update(point=name, step=step, rank=rank, spec=spec.describe())
        with open(run_dir / "events.jsonl", "a", encoding="utf-8") as f:  # one O_APPEND write
            f.write(json.dumps(record) + "\n")


def _corrupt_latest() -> None:
    """Flip one byte in the largest file of the newest committed checkpoint."""
    root = _CONTEXT.get("checkpoint_root")
    if root is None:
        return
    committed = sorted(p for p in root.glob("step_*") if (p / "COMMITTED").is_file())
    if not committed:
        return
    victim = max((p for p in committed[-1].iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
    with open(victim, "r+b") as f:
        f.seek(victim.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


def _slow_down(factor: float) -> None:
    now = time.monotonic()
    if _last_step_mark:
        time.sleep((factor - 1.0) * (now - _last_step_mark[0]))
        now = time.monotonic()
    _last_step_mark[:] = [now]


def fault_point(name: str, step: int | None = None) -> None:
    """Act out every fault armed for this point and due now."""
    for spec in _fire(name, step):
        if spec.kind in ("crash", "kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        elif spec.kind == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif spec.kind == "term":
            # The scheduler's preemption reaches the whole job: through the supervisor when there is one.
            os.kill(int(os.environ.get(SUPERVISOR_ENV, os.getpid())), signal.SIGTERM)
        elif spec.kind == "corrupt":
            _corrupt_latest()
            os.kill(os.getpid(), signal.SIGKILL)
        elif spec.kind == "sleep":
            time.sleep(spec.seconds)
        elif spec.kind == "slow":
            _slow_down(spec.factor)


def poison_loss(step: int) -> bool:
    """True if a `nan` fault is due for this step."""
    return bool(_fire("train:loss", step))


arm(parse_faults(os.environ.get(ENV_VAR, "")))
