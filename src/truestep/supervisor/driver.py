"""Spawning and watching the ranks of one attempt: what the restart loop asks of the world, as a protocol
(`RankDriver`). `ProcessDriver` does it for real -- the attempt's config file, a warm standby or a fresh
process per rank, the watch of their exits, heartbeats and /proc, the node link, forwarded signals -- and
tests replace it with a script of attempt ends (tests/test_supervisor_decisions.py) instead of patching
the loop's private methods."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from truestep.config.load import to_toml
from truestep.core.errors import ExitCode, FencedError, Outcome
from truestep.core.fsio import atomic_write, make_dir
from truestep.core.launch import Launch, without_launch
from truestep.core.names import attempt_config_path, heartbeat_path
from truestep.core.rundir import check_run_dir
from truestep.faults.hooks import fault_point
from truestep.faults.hooks import set_context as set_fault_context
from truestep.supervisor.watch import AttemptEnd, AttemptWatch, FailureKind, Rank, rank_exits

if TYPE_CHECKING:
    from truestep.supervisor.restart_loop import Supervisor

POLL_S = 0.1


def rank_launch(
    node: Launch, local: int, attempt: int, port: int, config_file: Path, config_sha256: str = ""
) -> Launch:
    """The launch record of local rank slot `local` of this node in `attempt`."""
    return node.for_rank(
        rank=node.node * node.local_world_size + local,
        local_rank=local,
        master_port=port,
        attempt=attempt,
        config_file=str(config_file),
        config_sha256=config_sha256,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankDriver(Protocol):
    def spawn(self, attempt: int) -> list[Rank]:
        """Start this node's ranks of `attempt`."""
        ...

    def watch(self, ranks: list[Rank]) -> AttemptEnd:
        """Until the attempt ends: how it ended."""
        ...

    def teardown(self, ranks: list[Rank]) -> None:
        """After a failure: end every rank still running, now."""
        ...

    def wait(self, ranks: list[Rank]) -> None:
        """After an orderly end: wait for every rank to exit."""
        ...


DriverFactory = Callable[["Supervisor"], RankDriver]
"""What a supervisor is given to build its driver (the driver reads and sets the supervisor's state: the
signals it forwards, the lease it may lose, the step times it has seen)."""


class ProcessDriver:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def spawn(self, attempt: int) -> list[Rank]:
        sup = self.sup
        # Every attempt, not only the first: a heartbeats/ or attempts/ swapped for a link or a file during
        # the last one is refused (exit 3) as the same state is at start, not a crash to retry (exit 1).
        check_run_dir(sup.run_dir)
        set_fault_context(run_dir=sup.run_dir, attempt=attempt)
        port = sup.spec.master_port or free_port()
        config_file = attempt_config_path(sup.run_dir, attempt, sup.spec.node_rank)
        make_dir(config_file.parent)
        config_blob = to_toml(sup.cfg).encode()
        atomic_write(config_file, config_blob)  # ranks load this, never the user's file
        config_sha256 = hashlib.sha256(config_blob).hexdigest()  # ... and only as written here
        first = sup.spec.node_rank * sup.spec.nproc
        for rank in range(first, first + sup.spec.nproc):
            heartbeat_path(sup.run_dir, rank).unlink(missing_ok=True)
        # Nothing of this process's own launch record (or a stale one) reaches a rank but through its own.
        base_env = {**without_launch(os.environ), "OMP_NUM_THREADS": str(sup.cfg.parallel.num_threads)}
        ranks = []
        for local in range(sup.spec.nproc):
            launch = rank_launch(sup.node_launch, local, attempt, port, config_file, config_sha256)
            proc = sup.standbys.launch(local, launch, base_env)  # a warm standby, else a fresh process
            ranks.append(Rank(first + local, proc, time.time()))
        sup.events.write(
            {
                "event": "attempt_start",
                "attempt": attempt,
                "pids": [r.proc.pid for r in ranks],
                "master_port": port,
            }
        )
        return ranks

    def watch(self, ranks: list[Rank]) -> AttemptEnd:
        sup = self.sup
        forwarded = interrupts_forwarded = 0
        watch = AttemptWatch(sup.run_dir, ranks, sup.cfg.resilience, sup.longest_step_s)
        # When a poll last found every rank running: a rank's exit came after it (failure.last_seen).
        running_at = min((r.spawned_at for r in ranks), default=time.time())
        while True:
            try:
                elsewhere = sup.nodes.check(sup.attempt)  # another node gone, or node 0 restarted
            except FencedError as err:
                sup.lost_lease, elsewhere = err, None
            if sup.lost_lease is not None:
                return AttemptEnd(Outcome.FENCED)
            if sup.signalled and not forwarded:
                self.send(ranks, signal.Signals[sup.signalled])
                forwarded = 1
                sup.events.write({"event": "signal_forwarded", "signal": sup.signalled})
            if sup.interrupts > interrupts_forwarded:
                if sup.interrupts >= 2:
                    return AttemptEnd(Outcome.INTERRUPTED)  # "stop now": the teardown kills every rank
                self.send(ranks, signal.SIGINT)
                interrupts_forwarded = sup.interrupts
                sup.events.write({"event": "signal_forwarded", "signal": "SIGINT"})
            polled_at = time.time()
            codes = {r.rank: r.proc.poll() for r in ranks}
            end = rank_exits(codes, sup.requeue_code)
            if end is not None and end.failure is not None and end.failure.kind == FailureKind.PROCESS_EXIT:
                end.failure.last_seen = running_at
            if all(code is None for code in codes.values()):
                running_at = polled_at
            if end is not None and end.code == ExitCode.FENCED:
                follow = sup.nodes.rank_fenced(sup.attempt)  # it saw node 0's restart before we did
                end = AttemptEnd(Outcome.FAILED, follow) if follow is not None else end
            if elsewhere is not None and (end is None or end.outcome == Outcome.FAILED):
                lost = elsewhere.kind == FailureKind.NODE_LOST
                end = AttemptEnd(Outcome.NODE_LOST if lost else Outcome.FAILED, elsewhere)
            if end is not None:
                if end.failure is not None:
                    end.failure.exit_codes = codes
                return end
            if sup.cfg.resilience.heartbeat:
                failure = watch.check()
                sup.longest_step_s = watch.longest_step_s  # a restart's attempt keeps what was timed
                if watch.paused_s is not None:  # left out of every deadline: say why detection was late
                    sup.events.write(
                        {"event": "watch_paused", "attempt": sup.attempt, "paused_s": watch.paused_s}
                    )
                if failure is not None:
                    failure.exit_codes = codes
                    return AttemptEnd(Outcome.FAILED, failure)
            sup.standbys.tick(ranks)
            time.sleep(POLL_S)

    @staticmethod
    def send(ranks: list[Rank], signum: signal.Signals) -> None:
        for rank in ranks:
            if rank.proc.poll() is None:
                rank.proc.send_signal(signum)

    def teardown(self, ranks: list[Rank]) -> None:
        """Kill every survivor now: after a failure nothing they do is worth waiting for (the newest
        committed checkpoint is the restart point), and SIGKILL also ends a SIGSTOPped process."""
        fault_point("teardown")  # e.g. `term:at=teardown`: a preemption notice meets this recovery
        for rank in ranks:
            if rank.proc.poll() is None:
                rank.proc.kill()
        for rank in ranks:
            rank.proc.wait()

    def wait(self, ranks: list[Rank]) -> None:
        for rank in ranks:
            rank.proc.wait()
