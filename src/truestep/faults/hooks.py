"""Fault points compiled into the code paths that matter, and what an armed fault does there.

Inert unless armed: with no spec, `fault_point` is one dict lookup. Specs are armed explicitly by a
rank at start-up (train/rank.py: its launch record's faults, from --fault and TRUESTEP_FAULTS, parsed
and checked) via `arm`, which also hands over who the rank is (rank, node, attempt, job clock,
supervisor) from that record; nothing happens at import. Every fault that fires is announced on stderr and, when a run directory is known,
written to its events.jsonl as `fault_injected` with its wall-clock time: detection latency and MTTR are
measured from the true fault time. The trainer hands over what a fault needs to know through
`set_context` (run directory, attempt number, where the newest committed checkpoint is).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import truestep
from truestep.core.fsio import append_bytes
from truestep.core.launch import Launch
from truestep.core.names import EVENTS_FILE
from truestep.faults.spec import FaultSpec

_ARMED: dict[str, list[FaultSpec]] = {}
_CONTEXT: dict[str, Any] = {}
_last_step_mark: list[float] = []


def arm(specs: list[FaultSpec], launch: Launch | None = None) -> None:
    """Arm `specs` in this process, which is the rank `launch` describes (default: this process's own
    launch record)."""
    _ARMED.clear()
    _CONTEXT["launch"] = launch if launch is not None else Launch.from_env()
    for spec in specs:
        _ARMED.setdefault(spec.at, []).append(spec)


def disarm() -> None:
    """Nothing armed, nothing known: the state before `arm` (a rank that returned, in-process)."""
    _ARMED.clear()
    _CONTEXT.clear()
    _last_step_mark.clear()


def _launch() -> Launch:
    return _CONTEXT.get("launch") or Launch()


def armed() -> list[FaultSpec]:
    return [s for specs in _ARMED.values() for s in specs]


def set_context(
    run_dir: Path | None = None,
    attempt: int | None = None,
    newest_committed: Callable[[], Path | None] | None = None,
) -> None:
    """Where to log fired faults, which attempt this is (for `restart=K`), and which checkpoint a
    `corrupt` fault damages (set by the trainer)."""
    for key, value in (("run_dir", run_dir), ("attempt", attempt), ("newest_committed", newest_committed)):
        if value is not None:
            _CONTEXT[key] = value


def _attempt() -> int:
    return _CONTEXT.get("attempt", _launch().attempt or 0)


def _elapsed() -> float:
    # Without a job clock: since this process started (a forked rank's start is its fork).
    return time.time() - (_launch().job_start or truestep.STARTED_AT)


def _node() -> tuple[int, int]:
    """(this rank's node in a multi-node job, its rank on that node), from its launch record."""
    return _launch().node, _launch().local_rank


def _supervisor_or_self() -> int:
    return _launch().supervisor_pid or os.getpid()


def _due(spec: FaultSpec, step: int | None, rank: int, attempt: int) -> bool:
    if spec.restart != attempt or (spec.rank is not None and spec.rank != rank):
        return False
    if spec.node is not None and _node() != (spec.node, 0):
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
    rank = _launch().rank
    fired = [s for s in specs if _due(s, step, rank, _attempt())]
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
        record.update(point=name, step=step, rank=rank, attempt=_attempt(), spec=spec.describe())
        if spec.node is not None:
            record.update(scope="node", node=spec.node, host=socket.gethostname())
        append_bytes(run_dir / EVENTS_FILE, (json.dumps(record) + "\n").encode())  # one O_APPEND write


def _corrupt_newest_committed() -> None:
    """Flip one byte in the largest file of the newest committed checkpoint."""
    find = _CONTEXT.get("newest_committed")
    victim_dir = find() if find is not None else None
    if victim_dir is None:
        return
    victim = max((p for p in victim_dir.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
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


def fault_point(name: str, step: int | None = None, mutate: Callable[[], object] | None = None) -> None:
    """Act out every fault armed for this point and due now. `mutate`: how a `mutate` fault changes the
    state at this point (the save passes one that changes the tensors it is writing)."""
    for spec in _fire(name, step):
        if spec.kind == "mutate":
            if mutate is None:
                raise RuntimeError(f"fault point {name} cannot act out a mutate fault")
            mutate()
        elif spec.kind == "kill" and spec.node is not None:
            # The whole node: its supervisor first (its other ranks die with it: PR_SET_PDEATHSIG).
            os.kill(_supervisor_or_self(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        elif spec.kind in ("crash", "kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        elif spec.kind == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif spec.kind == "term":
            # The scheduler's preemption reaches the whole job: through the supervisor when there is one.
            os.kill(os.getpid() if spec.to_rank else _supervisor_or_self(), signal.SIGTERM)
        elif spec.kind == "corrupt":
            _corrupt_newest_committed()
            os.kill(os.getpid(), signal.SIGKILL)
        elif spec.kind == "sleep":
            time.sleep(spec.seconds)
        elif spec.kind == "slow":
            _slow_down(spec.factor)


def poison_loss(step: int) -> bool:
    """True if a `nan` fault is due for this step."""
    return bool(_fire("train:loss", step))
