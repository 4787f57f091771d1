"""The warm template's side: import once, then fork every rank exactly as a fresh process would start.

A node's template is `python -m truestep standby FD CONFIG`, started by the supervisor (supervisor/
standby.py) with the environment its ranks will have, minus who each one is (`HANDED_ENV`: rank, local
rank, attempt, rendezvous port, attempt config file and its SHA-256). It dies with the supervisor like a
rank does (cli/main.py calls `die_with_supervisor` first), runs the warm-up it is given (imports only:
torch, truestep, what the config's run will import lazily), checks that it is still single-threaded,
reports ready with its memory footprint on the socket FD, and blocks on that socket. For each handoff
(a rank's launch record whole, core/launch.py, and the environment it goes on top of) it checks the
record, and that nothing but the handed fields differ from what it imported torch with, forks, and
answers with the new process's pid. The forked process adopts that environment, undoes what the
warm-up changed in process-global state, resets the process clock, and returns the argv of a rank,
`train`, for `truestep.cli.main.main` -- the same entry a fresh rank runs with the same record, so early
signal capture, fault arming, the lease fence and the heartbeat all start from the handoff on. When the
supervisor closes the socket, the template exits 1.

Wire format: one JSON object per line, each way (`ready` and `forked` from the template, handoffs to
it). Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import truestep
from truestep.core.errors import ExitCode
from truestep.core.launch import HANDED_ENV, Launch, LaunchError
from truestep.faults.hooks import arm, disarm, fault_point
from truestep.faults.hooks import set_context as set_fault_context
from truestep.faults.spec import FaultSpecError, parse_faults

__all__ = ["HANDED_ENV", "adopted_env", "env_differences", "become_rank", "parked_env", "serve"]
# HANDED_ENV: the only variables a forked rank may learn at its handoff (which rank it is, the attempt's
# number, rendezvous port, config file and that file's SHA-256). Everything else (threads, faults, job
# identity, anything torch reads at import) must already be what the template was started with, or the
# supervisor does not hand it the rank.

RANK_ARGV = ["train"]
"""What a standby becomes: `truestep train`, whose launch record says who it is."""

Warmup = Callable[[], Callable[[], None]]
"""Prepares the process (imports) and returns the function that undoes, at the handoff, whatever the
preparation changed in process-global state (the torch RNG)."""


def env_differences(parked: Mapping[str, str], rank: Mapping[str, str]) -> list[str]:
    """Variables, other than the handed ones, that differ between the template's environment and the one
    a rank must run with (sorted; empty = the template may fork it)."""
    keys = (set(parked) | set(rank)) - set(HANDED_ENV)
    return sorted(k for k in keys if parked.get(k) != rank.get(k))


def parked_env(rank_env: Mapping[str, str]) -> dict[str, str]:
    """The environment a node's warm template is started with: its ranks' less who each one is."""
    return {k: v for k, v in rank_env.items() if k not in HANDED_ENV}


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


def serve(fd: int, warmup: Warmup) -> list[str]:
    """Warm up once, report ready, then fork one rank per handoff until the supervisor closes the socket
    (exit 1 here). Returns only in a forked rank: the rank's argv."""
    started, started_env = time.time(), dict(os.environ)
    sock = socket.socket(fileno=fd)
    undo = warmup()
    warmed_env = dict(os.environ)  # imports may set variables (torch._inductor sets its cache dir)
    threads = _thread_count()
    if threads != 1:
        # A fork copies only the forking thread: a lock another thread held would stay held in every rank.
        _refuse(f"the warm-up left {threads} threads in this process; it forks ranks only single-threaded")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        # A CUDA context does not survive a fork: every forked rank would fail its first CUDA call.
        _refuse("the warm-up initialized CUDA; a template must not (its ranks create their own contexts)")
    ready = time.time()
    # The supervisor may have handed ranks over, and closed its end, while we were still importing:
    # then there is nobody to tell that we are ready, and the handoffs are waiting to be read.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        send_line(sock, {"pid": os.getpid(), "ready_at": ready, "warm_s": ready - started, **memory_kb()})
    reader = sock.makefile("rb")
    while line := reader.readline():  # a handoff sent before the close is still here to read
        received = time.time()
        handoff = json.loads(line)
        try:
            launch = Launch.from_env(handoff["launch"])
        except LaunchError as err:
            _refuse(f"handed a launch record that does not describe a rank: {err}")
        env = {**handoff["env"], **launch.to_env()}
        differ = env_differences(started_env, env)
        if differ:
            _refuse(f"handed an environment that differs in {differ} from the one it imported torch with")
        pid = _fork_adopted()
        if pid == 0:  # the rank: a fresh rank has no such descriptor
            reader.close()
            sock.close()
            return become_rank(launch, adopted_env(env, started_env, warmed_env), undo, received, handoff)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            send_line(sock, {"forked": pid, "rank": launch.rank})
    # The supervisor closed the socket (it ends, or discards this template), or is gone. Never exit 0:
    # a process of this node that ends with 0 could read as a rank that finished training.
    os._exit(ExitCode.FAILURE)


def become_rank(
    launch: Launch, env: dict[str, str], undo: Callable[[], None], received: float, handoff: dict
) -> list[str]:
    """In the forked process: become the rank exactly as a fresh process would be at this point."""
    _handoff_fault_point(launch)
    os.environ.clear()
    os.environ.update(env)
    sys.argv[1:] = RANK_ARGV
    undo()
    truestep.STARTED_AT = received  # this process starts being a rank now (run_start.process_start)
    sent = handoff.get("sent_at")
    if isinstance(sent, int | float) and not isinstance(sent, bool) and math.isfinite(sent):
        truestep.HANDED_OVER_AT = min(float(sent), received)  # run_start.handoff_at
    return list(RANK_ARGV)


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _fork_adopted() -> int:
    """Fork a process the supervisor adopts: its pid here, 0 in it. The middle process exits at once, so
    the new one is reparented to the supervisor (a child subreaper): it waits for it as for a fresh rank,
    and the rank's parent-death request (resilience/orphan.py) names the supervisor. The new process
    leads its own session, as a rank started with `start_new_session` does, and keeps this thread's
    signal mask (the preemption signals blocked until it captures them)."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read_end)
        middle_pid = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            os._exit(ExitCode.FAILURE)
        if pid == 0:
            os.close(write_end)
            while os.getppid() == middle_pid:  # until the middle process is gone and we are adopted
                time.sleep(0.0005)
            os.setsid()
            return 0
        os.write(write_end, str(pid).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        text = reader.read()
    os.waitpid(middle, 0)
    if not text:
        _refuse("could not fork a rank")
    return int(text)
