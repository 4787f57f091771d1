"""The warm standby's side of a restart: get ready, park, and become a rank exactly as a fresh process would.

A standby is `python -m truestep standby FD CONFIG`, started by the supervisor (supervisor/standby.py)
with the environment its rank slot will have, minus the launch-record fields that change from one
attempt to the next (`PER_ATTEMPT_ENV`: attempt, rendezvous port, attempt config file and its SHA-256).
It dies with the supervisor like a rank does (cli/main.py calls `die_with_supervisor` first), runs the warm-up it is given (imports: torch, truestep, what the config's
run will import lazily), reports ready with its memory footprint on the socket FD, and blocks on that
socket. The supervisor then either closes the socket (EOF: exit 1, nothing happened) or sends one
handoff: the rank's launch record whole (core/launch.py) and the environment it goes on top of. The
standby checks the record, and that nothing but the per-attempt fields differ from what it was started
(and imported torch) with, adopts that environment, undoes what the warm-up changed in process-global
state, resets the process clock, and returns the argv of a rank, `train`, for `truestep.cli.main.main`
— the same entry a fresh rank runs with the same record, so early signal capture, fault arming, the
lease fence and the heartbeat all start from the handoff on.

Wire format: one JSON object per line, each way (`ready` from the standby, `handoff` to it).
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import truestep
from truestep.core.errors import ExitCode
from truestep.core.launch import PER_ATTEMPT_ENV, Launch, LaunchError
from truestep.faults.hooks import arm, disarm, fault_point
from truestep.faults.hooks import set_context as set_fault_context
from truestep.faults.spec import FaultSpecError, parse_faults

__all__ = ["PER_ATTEMPT_ENV", "adopted_env", "env_differences", "park", "parked_env"]
# PER_ATTEMPT_ENV: the only variables a standby may learn at the handoff (the attempt's number,
# rendezvous port, config file and that file's SHA-256). Everything else (threads, RANK, faults, job identity, anything torch
# reads at import) must already be what the standby was started with, or the supervisor does not hand
# it over.

RANK_ARGV = ["train"]
"""What a standby becomes: `truestep train`, whose launch record says who it is."""

Warmup = Callable[[], Callable[[], None]]
"""Prepares the process (imports) and returns the function that undoes, at the handoff, whatever the
preparation changed in process-global state (the torch RNG)."""


def env_differences(parked: Mapping[str, str], rank: Mapping[str, str]) -> list[str]:
    """Variables, other than the per-attempt ones, that differ between a standby's environment and
    the one its rank must run with (sorted; empty = the standby fits)."""
    keys = (set(parked) | set(rank)) - set(PER_ATTEMPT_ENV)
    return sorted(k for k in keys if parked.get(k) != rank.get(k))


def parked_env(rank_env: Mapping[str, str]) -> dict[str, str]:
    """The environment a standby for this rank slot is started with."""
    return {k: v for k, v in rank_env.items() if k not in PER_ATTEMPT_ENV}


def adopted_env(
    rank: Mapping[str, str], started: Mapping[str, str], warmed: Mapping[str, str]
) -> dict[str, str]:
    """The rank's environment as a fresh process would have it at this point: what the supervisor
    handed over, plus what the warm-up's imports set or removed (they would have in a fresh rank too)."""
    out = dict(rank)
    out.update({k: v for k, v in warmed.items() if started.get(k) != v})
    for gone in set(started) - set(warmed):
        out.pop(gone, None)
    return out


def memory_kb(pid: int | str = "self") -> dict[str, int]:
    """Resident, proportional (shared pages split among their users) and private memory of a process,
    in KiB, from /proc/PID/smaps_rollup (empty where the kernel has no such file)."""
    fields = {
        "Rss:": "rss_kb",
        "Pss:": "pss_kb",
        "Private_Clean:": "private_kb",
        "Private_Dirty:": "private_kb",
    }
    out: dict[str, int] = {}
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] in fields:
            key = fields[parts[0]]
            out[key] = out.get(key, 0) + int(parts[1])
    return out


def send_line(sock: socket.socket, record: dict[str, Any]) -> None:
    sock.sendall((json.dumps(record, separators=(",", ":")) + "\n").encode())


def _refuse(message: str) -> None:
    print(f"truestep standby: {message}", file=sys.stderr, flush=True)
    os._exit(ExitCode.FAILURE)


def _handoff_fault_point(launch: Launch) -> None:
    """The `handoff` fault point (docs/faults.md: a fault that meets a restart as the standby becomes
    the rank): armed from the handed record, fired, disarmed -- the rank arms its faults afresh."""
    try:
        arm(parse_faults(launch.faults), launch)
    except FaultSpecError as err:  # the supervisor checked them: a record it did not write
        _refuse(f"handed a launch record with a bad fault spec: {err}")
    set_fault_context(run_dir=Path(launch.run_dir) if launch.run_dir else None, attempt=launch.attempt)
    try:
        fault_point("handoff")
    finally:
        disarm()


def park(fd: int, warmup: Warmup) -> list[str]:
    """Warm up, report ready, wait for the handoff; return the rank's argv (exits if there is none)."""
    started, started_env = time.time(), dict(os.environ)
    sock = socket.socket(fileno=fd)
    undo = warmup()
    warmed_env = dict(os.environ)  # imports may set variables (torch._inductor sets its cache dir)
    ready = time.time()
    # The supervisor may have handed this slot over, and closed its end, while we were still importing:
    # then there is nobody to tell that we are ready, and the handoff is waiting to be read.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        send_line(sock, {"pid": os.getpid(), "ready_at": ready, "warm_s": ready - started, **memory_kb()})
    with sock.makefile("rb") as reader:
        line = reader.readline()  # a handoff sent before the close is still here to read
    if not line:
        # The supervisor closed the slot without handing it over (or is gone). Never exit 0: a process
        # of this slot that ends with 0 would read as a rank that finished training.
        os._exit(ExitCode.FAILURE)
    received = time.time()
    handoff = json.loads(line)
    sock.close()  # a fresh rank has no such descriptor either
    try:
        launch = Launch.from_env(handoff["launch"])
    except LaunchError as err:
        _refuse(f"handed a launch record that does not describe a rank: {err}")
    env = {**handoff["env"], **launch.to_env()}
    differ = env_differences(started_env, env)
    if differ:
        _refuse(f"handed an environment that differs in {differ} from the one it imported torch with")
    _handoff_fault_point(launch)
    os.environ.clear()
    os.environ.update(adopted_env(env, started_env, warmed_env))
    sys.argv[1:] = RANK_ARGV
    undo()
    truestep.STARTED_AT = received  # this process starts being a rank now (run_start.process_start)
    sent = handoff.get("sent_at")
    if isinstance(sent, int | float) and not isinstance(sent, bool) and math.isfinite(sent):
        truestep.HANDED_OVER_AT = min(float(sent), received)  # run_start.handoff_at
    return list(RANK_ARGV)
