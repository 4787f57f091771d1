"""Warm standby ranks for the local supervisor (`resilience.warm_standby`).

Most of a restart on a small job is not detection or restore but new processes importing torch and
truestep (2.5-3 s of a 3.6 s MTTR measured on the demo job, and most of a cluster's requeue MTTR).
So the supervisor keeps, per rank slot, one parked process that has already done that
(supervisor/handoff.py), and at a restart hands it the rank instead of starting a cold one.

What a standby may hold is exactly what does not depend on any attempt: imported modules. Nothing of a
failed attempt's state (weights, optimizer, RNG streams, data position, process group or store) can
be in it, because it was started from the supervisor, never from a rank. It never touches the GPU.

Rules:
- A standby is started (always from the supervisor's main thread: PR_SET_PDEATHSIG follows the thread
  that forked) only once the slot's current rank reports phase `train` in its heartbeat, so that its
  imports do not compete for CPU with a start-up or restore. Without heartbeats, at once.
- At a restart a slot's standby is handed the rank's launch record (core/launch.py) whole, and only if
  it is alive and its environment equals the rank's outside the per-attempt fields (`PER_ATTEMPT`:
  attempt, rendezvous port, attempt config file and its SHA-256); otherwise it is discarded (`standby_discarded`, with
  the reason) and the rank starts cold. A standby still importing is handed over anyway (it is ahead of a cold one).
- A standby that dies before it is ready (a broken install would make every one die) switches warm
  standby off for the rest of the job, loudly; one that dies after is replaced.
- Every standby is killed when the supervisor ends, and dies with it if it is killed.

Events (the supervisor's events.jsonl): standby_spawned, standby_ready (warm_s, rss/pss/private
memory), standby_handoff (rank, pid, ready, parked_s), standby_discarded, standby_lost,
standby_disabled.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from truestep.core.launch import Launch
from truestep.core.names import heartbeat_path
from truestep.core.status import Phase
from truestep.resilience.early_signals import held_for_child
from truestep.resilience.heartbeat import read_heartbeat
from truestep.supervisor.handoff import env_differences, parked_env, send_line
from truestep.supervisor.watch import Rank
from truestep.telemetry.jsonl import JsonlWriter

RANK_COMMAND = [sys.executable, "-m", "truestep", "train"]
"""Every rank the supervisor starts, fresh or from a standby: `truestep train` run by this interpreter;
who it is (and which config it loads) is its launch record."""


@dataclass
class Standby:
    slot: int
    proc: subprocess.Popen
    sock: socket.socket
    """The supervisor's end of the socket pair (non-blocking)."""
    env: dict[str, str]
    spawned_at: float
    ready: dict[str, Any] | None = None
    """The standby's ready report (pid, ready_at, warm_s, memory), once it arrived."""
    _buffer: bytes = field(default=b"", repr=False)

    def poll_ready(self) -> bool:
        """Read the ready report if it has arrived; True the first time it does."""
        if self.ready is not None:
            return False
        try:
            chunk = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            chunk = b""
        self._buffer += chunk
        if b"\n" not in self._buffer:
            return False
        self.ready = json.loads(self._buffer.split(b"\n", 1)[0])
        return True

    def close(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class StandbyPool:
    """One standby per local rank slot of this node's supervisor."""

    def __init__(self, run_dir: Path, events: JsonlWriter, enabled: bool, heartbeats: bool) -> None:
        self.run_dir = run_dir
        self.events = events
        self.enabled = enabled
        self.heartbeats = heartbeats
        self.standbys: dict[int, Standby] = {}
        self.templates: dict[int, tuple[Launch, dict[str, str]]] = {}
        """slot -> (launch record, base environment) of the slot's latest rank: what its next standby is
        prepared for."""

    # --- at a (re)start: hand over or start cold -------------------------------------------------

    def launch(self, slot: int, launch: Launch, base_env: dict[str, str]) -> subprocess.Popen:
        """Start the rank of `slot` with this launch record on top of `base_env` (which holds none):
        the slot's standby if it fits, else a fresh process."""
        self.templates[slot] = (launch, base_env)
        env = {**base_env, **launch.to_env()}
        standby = self.standbys.pop(slot, None)
        if standby is not None:
            standby.poll_ready()  # whether it is still importing, for the event
            reason = self._unfit(standby, env)
            if reason is None:
                sent = time.time()
                try:
                    send_line(standby.sock, {"launch": launch.to_env(), "env": base_env, "sent_at": sent})
                except OSError as err:
                    reason = f"handoff failed: {err}"
                else:
                    standby.sock.close()
                    self._handed(standby, launch, sent)
                    return standby.proc
            self._discard(standby, reason)
        with held_for_child():  # a preemption notice before its handlers waits for them
            return subprocess.Popen(RANK_COMMAND, env=env, start_new_session=True)

    @staticmethod
    def _unfit(standby: Standby, env: dict[str, str]) -> str | None:
        code = standby.proc.poll()
        if code is not None:
            return f"it exited with code {code} while parked"
        differ = env_differences(standby.env, env)
        return f"the rank's environment differs in {differ}" if differ else None

    def _handed(self, standby: Standby, launch: Launch, sent: float) -> None:
        self.events.write(
            {
                "event": "standby_handoff",
                "slot": standby.slot,
                "rank": launch.rank,
                "pid": standby.proc.pid,
                "ready": standby.ready is not None,
                "parked_s": sent - standby.ready["ready_at"] if standby.ready else None,
                "sent_at": sent,
            }
        )

    def _discard(self, standby: Standby, reason: str) -> None:
        standby.close()
        self.events.write(
            {"event": "standby_discarded", "slot": standby.slot, "pid": standby.proc.pid, "reason": reason}
        )

    # --- while an attempt runs: keep every slot covered --------------------------------------------

    def tick(self, ranks: list[Rank]) -> None:
        """Called every supervisor poll: collect ready reports, notice deaths, start missing standbys."""
        if not self.enabled:
            return
        for slot, standby in list(self.standbys.items()):
            if standby.poll_ready():
                self.events.write({"event": "standby_ready", "slot": slot, **standby.ready})  # type: ignore[dict-item]
            code = standby.proc.poll()
            if code is not None:
                del self.standbys[slot]
                standby.close()
                self._lost(standby, code)
                if not self.enabled:
                    return
        for slot, rank in enumerate(ranks):
            if slot not in self.standbys and slot in self.templates and self._settled(rank):
                self._spawn(slot)

    def _settled(self, rank: Rank) -> bool:
        """The slot's rank is past start-up and restore (training), so a standby's imports can run."""
        if not self.heartbeats:
            return True
        if rank.proc.poll() is not None:
            return False
        beat = read_heartbeat(heartbeat_path(self.run_dir, rank.rank))
        return beat is not None and beat.get("pid") == rank.proc.pid and beat.get("phase") == Phase.TRAIN

    def _spawn(self, slot: int) -> None:
        launch, base_env = self.templates[slot]
        env = parked_env({**base_env, **launch.to_env()})
        ours, theirs = socket.socketpair()
        # The config it warms up for: the latest attempt's (the next one's holds the same resolved config).
        argv = [sys.executable, "-m", "truestep", "standby", str(theirs.fileno()), launch.config_file]
        try:
            with held_for_child():  # parked with them blocked: a notice waits for the rank it becomes
                proc = subprocess.Popen(argv, env=env, start_new_session=True, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        ours.setblocking(False)
        self.standbys[slot] = Standby(slot, proc, ours, env, time.time())
        self.events.write({"event": "standby_spawned", "slot": slot, "pid": proc.pid})

    def _lost(self, standby: Standby, code: int) -> None:
        record = {"event": "standby_lost", "slot": standby.slot, "pid": standby.proc.pid, "exit_code": code}
        self.events.write({**record, "ready": standby.ready is not None})
        if standby.ready is None:
            # It could not even import: every replacement would fail the same way. Say so and stop.
            self.enabled = False
            message = (
                f"warm standby switched off for this job: the standby for slot {standby.slot} (pid "
                f"{standby.proc.pid}) exited with code {code} before it was ready (its stderr is above); "
                "restarts start cold processes"
            )
            print(f"truestep launch: {message}", file=sys.stderr, flush=True)
            self.events.write({"event": "standby_disabled", "reason": message})

    def close(self) -> None:
        """Kill every standby (end of the job)."""
        for standby in self.standbys.values():
            standby.close()
        if self.standbys:
            self.events.write(
                {"event": "standby_stopped", "pids": [s.proc.pid for s in self.standbys.values()]}
            )
        self.standbys.clear()
