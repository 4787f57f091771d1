"""The local supervisor behind `truestep launch`: holds the run directory lease, runs the ranks of one
node, watches them (resilience/watch.py), tears the job down promptly on a failure or hang, and restarts
it like a SLURM requeue would.

Why not torchrun's elastic agent: it never notices a hung rank, its file-timer watchdog takes itself down
too, and restarting gloo ranks at different times needs a workaround. Here every attempt gets a fresh
rendezvous port (on one node), so nothing of the previous attempt's store survives into the next.

Attempts are numbered job-wide by the lease's incarnation: node 0 bumps it, the other nodes of a
multi-node job wait for the bump, so every node and every rank logs the same number for one attempt.
What a node cannot see in its own ranks -- another node gone, the job moved on -- is judged by
resilience/nodes.py: after a local failure every node restarts in place, but when a whole node is gone
the survivors stop (exit 77) so that the scheduler requeues the job onto healthy nodes.
Ranks run in their own session (a Ctrl-C reaches only the supervisor, which forwards it exactly once)
and die with the supervisor (resilience/orphan.py). A restarted rank is a warm standby handed its rank
when one is parked for its slot (resilience/standby.py), else a fresh process.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from truestep.config.load import to_toml
from truestep.config.schema import JobConfig
from truestep.core.errors import NOT_RETRYABLE, ExitCode, FencedError, TruestepError
from truestep.core.fsio import atomic_write, make_dir
from truestep.core.names import (
    ENV_ATTEMPT,
    ENV_JOB_ID,
    ENV_JOB_START,
    ENV_SUPERVISOR_PID,
    EVENTS_FILE,
    attempt_config_path,
    heartbeat_path,
)
from truestep.resilience.lease import RunDirLease
from truestep.resilience.nodes import JobNodes
from truestep.resilience.standby import StandbyPool
from truestep.resilience.watch import AttemptWatch, Failure, Rank
from truestep.telemetry.jsonl import JsonlWriter

POLL_S = 0.1


@dataclass
class LaunchSpec:
    nproc: int
    max_restarts: int = 3
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    """0 = pick a free port for every attempt (single node only)."""
    job_id: str = ""
    """Identity of the job holding the run directory lease; every node of a job must use the same."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Supervisor:
    def __init__(self, spec: LaunchSpec, cfg: JobConfig) -> None:
        self.spec = spec
        self.cfg = cfg
        self.run_dir = Path(cfg.run.dir)
        make_dir(self.run_dir)
        self.lease = RunDirLease(self.run_dir, spec.job_id, cfg.resilience.lease_ttl_s)
        self.nodes = JobNodes(
            self.run_dir, spec.job_id, spec.node_rank, spec.nnodes, spec.master_addr, cfg.resilience
        )
        hub_port = self.nodes.hub_port  # published in the lease for the other nodes
        taken_over = self.lease.acquire(hub_port) if spec.node_rank == 0 else None  # refuses a second job
        self.events = JsonlWriter(
            self.run_dir / EVENTS_FILE,
            {"source": "supervisor", "node": spec.node_rank, "host": socket.gethostname()},
        )
        if taken_over is not None:
            self.events.write({"event": "lease_taken_over", "previous": taken_over.describe()})
        r = cfg.resilience
        self.standbys = StandbyPool(self.run_dir, self.events, r.warm_standby, r.heartbeat)
        self.requeue_code = cfg.resilience.requeue_exit_code
        self.signalled: str | None = None
        self.interrupts = 0
        self.lost_lease: FencedError | None = None
        self.attempt = -1
        self.outcome = "error"
        """How the supervisor ended (supervisor_end's outcome), told to the other nodes."""
        self.job_start = time.time()
        preemption = cfg.resilience.preemption_signals()
        for signum in preemption:
            signal.signal(signum, self._on_signal)
        if signal.SIGINT not in preemption:
            signal.signal(signal.SIGINT, self._on_interrupt)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.signalled is None:
            self.signalled = signal.Signals(signum).name
            self.events.write({"event": "supervisor_signal", "signal": self.signalled})

    def _on_interrupt(self, signum: int, frame: object) -> None:
        self.interrupts += 1
        self.events.write({"event": "supervisor_signal", "signal": "SIGINT", "count": self.interrupts})

    def _on_lease_lost(self, err: FencedError) -> None:
        self.lost_lease = err

    # --- one attempt -------------------------------------------------------------------------------

    def _next_attempt(self) -> int:
        attempt, joined = self.nodes.next_attempt(self.lease, self.attempt)
        if joined is not None:
            self.events.write({"event": "node_joined", "hub": joined})
        return attempt

    def _spawn(self, attempt: int) -> list[Rank]:
        port = self.spec.master_port or free_port()
        world = self.spec.nproc * self.spec.nnodes
        config_file = attempt_config_path(self.run_dir, attempt, self.spec.node_rank)
        make_dir(config_file.parent)
        atomic_write(config_file, to_toml(self.cfg).encode())  # ranks load this, never the user's file
        first = self.spec.node_rank * self.spec.nproc
        for rank in range(first, first + self.spec.nproc):
            heartbeat_path(self.run_dir, rank).unlink(missing_ok=True)
        ranks = []
        for local in range(self.spec.nproc):
            env = dict(os.environ)
            env.update(
                RANK=str(first + local),
                LOCAL_RANK=str(local),
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(self.spec.nproc),
                GROUP_RANK=str(self.spec.node_rank),
                MASTER_ADDR=self.spec.master_addr,
                MASTER_PORT=str(port),
                OMP_NUM_THREADS=str(self.cfg.parallel.num_threads),
            )
            env[ENV_ATTEMPT] = str(attempt)
            env[ENV_SUPERVISOR_PID] = str(os.getpid())
            env[ENV_JOB_ID] = self.spec.job_id
            env.setdefault(ENV_JOB_START, str(self.job_start))
            cmd = [sys.executable, "-m", "truestep", "train", str(config_file)]
            proc = self.standbys.launch(local, cmd, env)  # a warm standby, else a fresh process
            ranks.append(Rank(first + local, proc, time.time()))
        self.events.write(
            {
                "event": "attempt_start",
                "attempt": attempt,
                "pids": [r.proc.pid for r in ranks],
                "master_port": port,
            }
        )
        return ranks

    def _exit_outcome(self, codes: dict[int, int | None]) -> tuple[str, Failure | None] | None:
        bad = {r: c for r, c in codes.items() if c is not None and c not in self._clean_codes()}
        if bad:
            stop = sorted(c for c in bad.values() if c in NOT_RETRYABLE)
            if stop:
                return f"exit:{stop[0]}", None
            killed = [r for r, c in bad.items() if c < 0]  # died of a signal: the likely origin
            rank = (killed or sorted(bad))[0]
            return "failed", Failure("process_exit", rank, f"exit codes {bad}", codes)
        if any(c is None for c in codes.values()):
            return None
        if all(c == 0 for c in codes.values()):
            return "completed", None
        if any(c == ExitCode.INTERRUPTED for c in codes.values()):
            return "interrupted", None
        return "requeue", None

    def _clean_codes(self) -> set[int]:
        return {0, self.requeue_code, self.requeue_code + 1, ExitCode.INTERRUPTED}

    def _watch(self, ranks: list[Rank]) -> tuple[str, Failure | None]:
        """Return (completed | requeue | interrupted | failed | fenced | exit:CODE, failure)."""
        forwarded = interrupts_forwarded = 0
        watch = AttemptWatch(self.run_dir, ranks, self.cfg.resilience)
        while True:
            try:
                elsewhere = self.nodes.check(self.attempt)  # another node gone, or node 0 restarted
            except FencedError as err:
                self.lost_lease, elsewhere = err, None
            if self.lost_lease is not None:
                return "fenced", None
            if self.signalled and not forwarded:
                self._send(ranks, signal.Signals[self.signalled])
                forwarded = 1
                self.events.write({"event": "signal_forwarded", "signal": self.signalled})
            if self.interrupts > interrupts_forwarded:
                if self.interrupts >= 2:
                    return "interrupted", None  # "stop now": the teardown kills every rank
                self._send(ranks, signal.SIGINT)
                interrupts_forwarded = self.interrupts
                self.events.write({"event": "signal_forwarded", "signal": "SIGINT"})
            codes = {r.rank: r.proc.poll() for r in ranks}
            outcome = self._exit_outcome(codes)
            if outcome == (f"exit:{ExitCode.FENCED}", None):
                follow = self.nodes.rank_fenced(self.attempt)  # it saw node 0's restart before we did
                outcome = ("failed", follow) if follow is not None else outcome
            if elsewhere is not None and (outcome is None or outcome[0] == "failed"):
                outcome = ("node_lost" if elsewhere.kind == "node_lost" else "failed", elsewhere)
            if outcome is not None:
                if outcome[1] is not None:
                    outcome[1].exit_codes = codes
                return outcome
            if self.cfg.resilience.heartbeat:
                failure = watch.check()
                if failure is not None:
                    failure.exit_codes = codes
                    return "failed", failure
            self.standbys.tick(ranks)
            time.sleep(POLL_S)

    @staticmethod
    def _send(ranks: list[Rank], signum: signal.Signals) -> None:
        for rank in ranks:
            if rank.proc.poll() is None:
                rank.proc.send_signal(signum)

    @staticmethod
    def _teardown(ranks: list[Rank]) -> None:
        """Kill every survivor now: after a failure nothing they do is worth waiting for (the newest
        committed checkpoint is the restart point), and SIGKILL also ends a SIGSTOPped process."""
        for rank in ranks:
            if rank.proc.poll() is None:
                rank.proc.kill()
        for rank in ranks:
            rank.proc.wait()

    def _end(self, outcome: str, restarts: int, code: int) -> int:
        self.outcome = outcome
        self.events.write(
            {"event": "supervisor_end", "attempt": self.attempt, "outcome": outcome, "restarts": restarts,
             "exit_code": code}
        )  # fmt: skip
        return code

    def _failure_detected(self, failure: Failure, detected: float) -> None:
        self.events.write(
            {
                "event": "failure_detected",
                "attempt": self.attempt,
                **failure.to_event(),
                "detected_at": detected,
            }
        )

    # --- the restart loop --------------------------------------------------------------------------

    def run(self) -> int:
        self.events.write(
            {
                "event": "supervisor_start",
                "nproc": self.spec.nproc,
                "nnodes": self.spec.nnodes,
                "max_restarts": self.spec.max_restarts,
                "job": self.spec.job_id,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"),
            }
        )
        if self.spec.node_rank == 0:
            self.lease.keep(self._on_lease_lost)
        restarts = 0
        while True:
            self.attempt = self._next_attempt()
            ranks = self._spawn(self.attempt)
            outcome, failure = self._watch(ranks)
            if failure is not None or outcome in ("fenced", "interrupted"):
                detected, since = time.time(), time.monotonic()
                if failure is not None:
                    self._failure_detected(failure, detected)
                self._teardown(ranks)
                self.events.write(
                    {
                        "event": "teardown_complete",
                        "attempt": self.attempt,
                        "teardown_s": time.time() - detected,
                    }
                )
                if failure is not None and failure.kind != "node_lost":
                    outcome, failure = self._before_restart(outcome, failure, since)
            else:
                for rank in ranks:
                    rank.proc.wait()
            if outcome == "completed":
                return self._end(outcome, restarts, ExitCode.OK)
            if outcome == "fenced":
                print(f"truestep launch: {self.lost_lease}", file=sys.stderr, flush=True)
                return self._end(outcome, restarts, ExitCode.FENCED)
            if outcome == "node_lost" and failure is not None and failure.loss is not None:
                print(
                    f"truestep launch: {failure.detail}; stopping for a requeue", file=sys.stderr, flush=True
                )
                return self._end(outcome, restarts, failure.loss.exit_code())
            if outcome == "interrupted" or self.interrupts:
                return self._end("interrupted", restarts, ExitCode.INTERRUPTED)
            if outcome.startswith("exit:"):
                return self._end("refused", restarts, int(outcome.split(":")[1]))
            if self.signalled:
                # We are being preempted ourselves: the scheduler requeues the whole job.
                return self._end("requeue", restarts, self.requeue_code)
            if restarts >= self.spec.max_restarts:
                return self._end(
                    "gave_up", restarts, self.requeue_code if outcome == "requeue" else ExitCode.FAILURE
                )
            restarts += 1
            self.events.write({"event": "restart", "restart": restarts, "after": outcome})

    def _before_restart(self, outcome: str, failure: Failure, since: float) -> tuple[str, Failure | None]:
        """A local failure: restart in place only while the job is still ours and every node is there."""
        try:
            lost = self.nodes.before_restart(self.attempt, since)
        except FencedError as err:
            self.lost_lease = err
            return "fenced", None
        if lost is None or lost.kind != "node_lost":
            return outcome, failure
        self._failure_detected(lost, lost.loss.at if lost.loss else time.time())
        return "node_lost", lost


def run_supervisor(spec: LaunchSpec, cfg: JobConfig) -> int:
    supervisor = Supervisor(spec, cfg)
    code = int(ExitCode.FAILURE)
    try:
        code = supervisor.run()
        return code
    except TruestepError as err:  # e.g. node 0 gone while this node waited for its next attempt
        code, supervisor.outcome = err.exit_code, type(err).__name__
        supervisor.events.write(
            {"event": "supervisor_end", "attempt": supervisor.attempt, "outcome": type(err).__name__,
             "exit_code": int(code), "detail": str(err)}
        )  # fmt: skip
        raise
    finally:
        supervisor.standbys.close()
        # Goodbye with the exit code: the other nodes tell an end from a loss.
        supervisor.nodes.close(code, supervisor.outcome)
        if spec.node_rank == 0:
            supervisor.lease.release()
        supervisor.events.close()
