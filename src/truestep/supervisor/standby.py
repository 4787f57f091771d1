"""The warm template of the local supervisor (`resilience.warm_standby`): import once, fork every rank.

Most of a small job's start and restart is not detection or restore but new processes importing torch
and truestep (2.5-3 s of CPU each here, once per rank per attempt). So the supervisor starts, when its
first attempt starts, one **template** process per node that does that once (supervisor/handoff.py) and
then forks each rank of every attempt: the first attempt's ranks as well as a restart's. On this 2-core
machine a world-2 job with one restart imported torch 6 times with a standby per rank slot (2 ranks, 2
standbys, their 2 replacements), once with the template.

What the template may hold is exactly what does not depend on any attempt: imported modules. Nothing of
an attempt's state (weights, optimizer, RNG streams, data position, process group or store) can be in
it or in what it forks, because it never was a rank and was started from the supervisor. It never
touches the GPU, and forks only while single-threaded (it checks).

Rules:
- The template is started (always from the supervisor's main thread: PR_SET_PDEATHSIG follows the thread
  that forked) at the first attempt's first rank, with that rank's environment less who it is
  (`HANDED_ENV`: rank, local rank, attempt, rendezvous port, attempt config file and its SHA-256).
- A rank is forked only if the template is alive and the rank's environment equals the template's
  outside the handed fields; otherwise the template is discarded (`standby_discarded`, with the
  reason) and the rank starts cold. A template still importing is handed the rank anyway (it forks it
  once its imports are done: no later than a cold start would have been ready); one that has not
  answered in `REPLY_S` is discarded.
- The supervisor is a child subreaper while it has a template (core/parent_death.py): the template
  double-forks, so each rank is the supervisor's own child, waited for by pid (supervisor/forked.py),
  with the supervisor as the parent its parent-death request names -- as a fresh rank.
- A template that dies before it is ready (a broken install would make every one die) switches warm
  standby off for the rest of the job, loudly; one that dies after is replaced once the ranks train.
- The template is killed when the supervisor ends, and dies with it if it is killed.

Events (the supervisor's events.jsonl): standby_spawned, standby_ready (warm_s, rss/pss/private
memory), standby_handoff (slot, rank, pid of the forked rank, ready, parked_s), standby_discarded,
standby_lost, standby_disabled, standby_stopped.
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
from truestep.core.parent_death import adopt_orphans
from truestep.core.status import Phase
from truestep.resilience.early_signals import held_for_child
from truestep.resilience.heartbeat import read_heartbeat
from truestep.supervisor.forked import ForkedRank
from truestep.supervisor.handoff import env_differences, parked_env, send_line
from truestep.supervisor.watch import Rank, RankProcess
from truestep.telemetry.jsonl import JsonlWriter

RANK_COMMAND = [sys.executable, "-m", "truestep", "train"]
"""Every rank started cold: `truestep train` run by this interpreter; who it is (and which config it
loads) is its launch record."""
REPLY_S = 120.0
"""How long the supervisor waits for the template to answer a handoff with the forked rank's pid (a
template still importing answers once its imports are done)."""


class NoReply(Exception):
    """The template did not answer a handoff."""


@dataclass
class Standby:
    """A node's warm template (the name is the mechanism's: `resilience.warm_standby`)."""

    proc: subprocess.Popen
    sock: socket.socket
    """The supervisor's end of the socket pair (non-blocking between handoffs)."""
    env: dict[str, str]
    ready: dict[str, Any] | None = None
    """The template's ready report (pid, ready_at, warm_s, memory), once it arrived."""
    announced: bool = False
    """Whether the pool has written the ready report's event."""
    _buffer: bytes = field(default=b"", repr=False)
    _answers: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def poll_ready(self) -> bool:
        """Read what has arrived; True the first time this finds the ready report in (it may have come in
        while waiting for an answer)."""
        if self.ready is None:
            self._receive(until=None)
        first = self.ready is not None and not self.announced
        self.announced = self.announced or first
        return first

    def forked(self, deadline: float) -> int:
        """The pid of the rank the template forked for the last handoff (NoReply if none by `deadline`)."""
        while not self._answers:
            if not self._receive(until=deadline):
                raise NoReply("it closed the socket" if self.proc.poll() is not None else "no answer in time")
        return int(self._answers.pop(0)["forked"])

    def _receive(self, until: float | None) -> bool:
        """Read what has arrived (waiting until `until` if given); False at EOF or timeout."""
        try:
            if until is not None:
                self.sock.settimeout(max(0.001, until - time.time()))
            chunk = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:  # a timeout included
            return False
        finally:
            self.sock.setblocking(False)
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            record = json.loads(line)
            if "forked" in record:
                self._answers.append(record)
            elif self.ready is None:
                self.ready = record
        return bool(chunk)

    def close(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class StandbyPool:
    """The warm template of this node's supervisor, and the ranks it forks."""

    def __init__(self, run_dir: Path, events: JsonlWriter, enabled: bool, heartbeats: bool) -> None:
        self.run_dir = run_dir
        self.events = events
        self.heartbeats = heartbeats
        self.standby: Standby | None = None
        self.template: tuple[Launch, dict[str, str]] | None = None
        """(launch record, base environment) of the latest rank launched: what a replacement template
        is started for."""
        self.started = False
        """Whether this supervisor has launched a rank yet (its first attempt's are forked too)."""
        self.subreaper = enabled and adopt_orphans(True)
        self.enabled = enabled
        if enabled and not self.subreaper:
            self._disable("this kernel cannot make the supervisor a child subreaper (Linux only)")

    # --- at a (re)start: fork from the template or start cold -----------------------------------

    def launch(self, slot: int, launch: Launch, base_env: dict[str, str]) -> RankProcess:
        """Start the rank of `slot` with this launch record on top of `base_env` (which holds none):
        forked from the template if it fits, else a fresh process."""
        self.template = (launch, base_env)
        env = {**base_env, **launch.to_env()}
        if self.enabled and self.standby is None and not self.started:
            self._spawn()  # the first attempt's ranks are forked too
        self.started = True
        standby = self.standby
        if standby is not None:
            self._announce(standby)  # whether it is still importing, for the event
            reason = self._unfit(standby, env)
            if reason is None:
                sent = time.time()
                try:
                    send_line(standby.sock, {"launch": launch.to_env(), "env": base_env, "sent_at": sent})
                    pid = standby.forked(sent + REPLY_S)
                except (OSError, NoReply) as err:
                    reason = f"handoff failed: {err}"
                else:
                    self._announce(standby)
                    self._handed(standby, slot, launch, pid, sent)
                    return ForkedRank(pid)
            self.standby = None
            self._discard(standby, reason)
            code = standby.proc.returncode
            if standby.ready is None and code is not None and code >= 0:
                self._lost(standby, code)  # it exited before it was ever ready: a replacement would too
        with held_for_child():  # a preemption notice before its handlers waits for them
            return subprocess.Popen(RANK_COMMAND, env=env, start_new_session=True)

    def _announce(self, standby: Standby) -> None:
        if standby.poll_ready():
            self.events.write({"event": "standby_ready", **standby.ready})  # type: ignore[dict-item]

    @staticmethod
    def _unfit(standby: Standby, env: dict[str, str]) -> str | None:
        code = standby.proc.poll()
        if code is not None:
            return f"it exited with code {code} while parked"
        differ = env_differences(standby.env, env)
        return f"the rank's environment differs in {differ}" if differ else None

    def _handed(self, standby: Standby, slot: int, launch: Launch, pid: int, sent: float) -> None:
        self.events.write(
            {
                "event": "standby_handoff",
                "slot": slot,
                "rank": launch.rank,
                "attempt": launch.attempt,
                "pid": pid,
                "template": standby.proc.pid,
                "ready": standby.ready is not None and standby.ready["ready_at"] <= sent,
                "parked_s": sent - standby.ready["ready_at"]
                if standby.ready and standby.ready["ready_at"] <= sent
                else None,
                "sent_at": sent,
            }
        )

    def _discard(self, standby: Standby, reason: str) -> None:
        standby.close()
        self.events.write({"event": "standby_discarded", "pid": standby.proc.pid, "reason": reason})

    # --- while an attempt runs: keep the node covered ---------------------------------------------

    def tick(self, ranks: list[Rank]) -> None:
        """Called every supervisor poll: collect the ready report, notice a death, replace a lost one."""
        if not self.enabled:
            return
        standby = self.standby
        if standby is not None:
            self._announce(standby)
            code = standby.proc.poll()
            if code is not None:
                self.standby = None
                standby.close()
                self._lost(standby, code)
                return
        if self.standby is None and self.template is not None and all(self._settled(r) for r in ranks):
            self._spawn()

    def _settled(self, rank: Rank) -> bool:
        """The rank is past start-up and restore (training), so a replacement's imports can run."""
        if not self.heartbeats:
            return True
        if rank.proc.poll() is not None:
            return False
        beat = read_heartbeat(heartbeat_path(self.run_dir, rank.rank))
        return beat is not None and beat.get("pid") == rank.proc.pid and beat.get("phase") == Phase.TRAIN

    def _spawn(self) -> None:
        assert self.template is not None
        launch, base_env = self.template
        env = parked_env({**base_env, **launch.to_env()})
        ours, theirs = socket.socketpair()
        # The config it warms up for: the latest attempt's (every attempt holds the same resolved config).
        argv = [sys.executable, "-m", "truestep", "standby", str(theirs.fileno()), launch.config_file]
        try:
            with held_for_child():  # it keeps them blocked, and so do the ranks it forks until they capture
                proc = subprocess.Popen(argv, env=env, start_new_session=True, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        ours.setblocking(False)
        self.standby = Standby(proc, ours, env)
        self.events.write({"event": "standby_spawned", "pid": proc.pid})

    def _lost(self, standby: Standby, code: int) -> None:
        record = {"event": "standby_lost", "pid": standby.proc.pid, "exit_code": code}
        self.events.write({**record, "ready": standby.ready is not None})
        if standby.ready is None:
            # It could not even import: every replacement would fail the same way. Say so and stop.
            self._disable(
                f"the template (pid {standby.proc.pid}) exited with code {code} before it was ready "
                "(its stderr is above)"
            )

    def _disable(self, why: str) -> None:
        self.enabled = False
        message = f"warm standby switched off for this job: {why}; ranks start cold processes"
        print(f"truestep launch: {message}", file=sys.stderr, flush=True)
        self.events.write({"event": "standby_disabled", "reason": message})

    def close(self) -> None:
        """Kill the template (end of the job); the ranks it forked are the supervisor's own children."""
        if self.standby is not None:
            self.standby.close()
            self.events.write({"event": "standby_stopped", "pids": [self.standby.proc.pid]})
        self.standby = None
        if self.subreaper:
            adopt_orphans(False)
            self.subreaper = False
