"""The local supervisor behind `truestep launch`: holds the run directory lease, runs the ranks of one
node, watches them (resilience/watch.py), tears the job down promptly on a failure or hang, and restarts
it like a SLURM requeue would.

Why not torchrun's elastic agent: it never notices a hung rank, its file-timer watchdog takes itself down
too, and restarting gloo ranks at different times needs a workaround. Here every attempt gets a fresh
rendezvous port (on one node), so nothing of the previous attempt's store survives into the next.

Attempts are numbered job-wide by the lease's incarnation: node 0 bumps it, the other nodes of a
multi-node job wait for the bump, so every node and every rank logs the same number for one attempt.
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
from truestep.core.errors import NOT_RETRYABLE, ExitCode, FencedError
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
from truestep.resilience.lease import RunDirLease, await_attempt
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
        taken_over = self.lease.acquire() if spec.node_rank == 0 else None  # refuses a second job
        self.events = JsonlWriter(
            self.run_dir / EVENTS_FILE, {"source": "supervisor", "node": spec.node_rank}
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
        if self.spec.node_rank == 0:
            return self.lease.begin_attempt()
        timeout = self.cfg.resilience.startup_timeout_s
        return await_attempt(self.run_dir, self.spec.job_id, self.attempt, timeout)

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
            if outcome is not None:
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
        self.events.write(
            {"event": "supervisor_end", "outcome": outcome, "restarts": restarts, "exit_code": code}
        )
        return code

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
                detected = time.time()
                if failure is not None:
                    self.events.write(
                        {
                            "event": "failure_detected",
                            "attempt": self.attempt,
                            "kind": failure.kind,
                            "rank": failure.rank,
                            "detail": failure.detail,
                            "exit_codes": {str(k): v for k, v in failure.exit_codes.items()},
                            "detected_at": detected,
                        }
                    )
                self._teardown(ranks)
                self.events.write({"event": "teardown_complete", "teardown_s": time.time() - detected})
            else:
                for rank in ranks:
                    rank.proc.wait()
            if outcome == "completed":
                return self._end(outcome, restarts, ExitCode.OK)
            if outcome == "fenced":
                print(f"truestep launch: {self.lost_lease}", file=sys.stderr, flush=True)
                return self._end(outcome, restarts, ExitCode.FENCED)
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


def run_supervisor(spec: LaunchSpec, cfg: JobConfig) -> int:
    supervisor = Supervisor(spec, cfg)
    try:
        return supervisor.run()
    finally:
        supervisor.standbys.close()
        if spec.node_rank == 0:
            supervisor.lease.release()
        supervisor.events.close()
