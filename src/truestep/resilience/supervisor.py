"""The local supervisor behind `truestep launch`: runs the ranks of one node, watches them, tears the
job down promptly on a failure or hang, and restarts it like a SLURM requeue would.

Why not torchrun's elastic agent: it never notices a hung rank, its file-timer watchdog takes itself down
too, and restarting gloo ranks at different times needs a workaround. Here every attempt gets a fresh
rendezvous port, so nothing of the previous attempt's store survives into the next.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from truestep.config.schema import JobConfig
from truestep.resilience.heartbeat import HEARTBEAT_DIR, heartbeat_path, read_heartbeat
from truestep.telemetry.jsonl import JsonlWriter, read_jsonl
from truestep.telemetry.run_logs import EVENTS_FILE

POLL_S = 0.1


@dataclass
class LaunchSpec:
    config: str
    overrides: list[str]
    nproc: int
    max_restarts: int = 3
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    """0 = pick a free port for every attempt (single node only)."""


@dataclass
class Failure:
    kind: str
    """process_exit, stale_heartbeat or no_progress."""
    rank: int
    detail: str
    exit_codes: dict[int, int | None] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Supervisor:
    def __init__(self, spec: LaunchSpec, cfg: JobConfig) -> None:
        self.spec = spec
        self.cfg = cfg
        self.run_dir = Path(cfg.run.dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.events = JsonlWriter(
            self.run_dir / EVENTS_FILE, {"source": "supervisor", "node": spec.node_rank}
        )
        self.requeue_code = cfg.resilience.requeue_exit_code
        self.signalled: str | None = None
        self.job_start = time.time()
        # Attempts are numbered across requeues (each launch of the supervisor continues the count),
        # like the trainer's attempt id: TRUESTEP_RESTART_COUNT is this global number.
        self.first_attempt = sum(
            1 for e in read_jsonl(self.run_dir / EVENTS_FILE) if e.get("event") == "attempt_start"
        )
        for name in filter(None, (s.strip() for s in cfg.resilience.signals.split(","))):
            signal.signal(signal.Signals[name], self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.signalled is None:
            self.signalled = signal.Signals(signum).name
            self.events.write({"event": "supervisor_signal", "signal": self.signalled})

    # --- one attempt -------------------------------------------------------------------------------

    def _spawn(self, attempt: int) -> list[subprocess.Popen]:
        port = self.spec.master_port or free_port()
        world = self.spec.nproc * self.spec.nnodes
        hb_dir = self.run_dir / HEARTBEAT_DIR
        if hb_dir.is_dir():
            for stale in hb_dir.iterdir():
                stale.unlink()
        procs = []
        for local in range(self.spec.nproc):
            env = dict(os.environ)
            env.update(
                RANK=str(self.spec.node_rank * self.spec.nproc + local),
                LOCAL_RANK=str(local),
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(self.spec.nproc),
                GROUP_RANK=str(self.spec.node_rank),
                MASTER_ADDR=self.spec.master_addr,
                MASTER_PORT=str(port),
                TRUESTEP_RESTART_COUNT=str(attempt),
                TRUESTEP_SUPERVISOR_PID=str(os.getpid()),
            )
            env.setdefault("TRUESTEP_JOB_START", str(self.job_start))
            env.setdefault("OMP_NUM_THREADS", str(self.cfg.parallel.num_threads))
            cmd = [sys.executable, "-m", "truestep", "train", self.spec.config, *self.spec.overrides]
            procs.append(subprocess.Popen(cmd, env=env))
        self.events.write(
            {
                "event": "attempt_start",
                "restart": attempt,
                "pids": [p.pid for p in procs],
                "master_port": port,
            }
        )
        return procs

    def _check_heartbeats(
        self, procs: list[subprocess.Popen], progress: dict[int, tuple[int, str, float]]
    ) -> Failure | None:
        """Liveness for every phase; progress only while every rank trains; a bound on shutdown.

        Progress is judged job-wide: while any rank is starting, checkpointing or restoring, its peers
        may legitimately sit in a collective waiting for it, so nobody's stall clock runs.
        """
        r = self.cfg.resilience
        now = time.time()
        beats: dict[int, dict] = {}
        for local, proc in enumerate(procs):
            rank = self.spec.node_rank * self.spec.nproc + local
            beat = read_heartbeat(heartbeat_path(self.run_dir, rank))
            if beat is None or beat.get("pid") != proc.pid or proc.poll() is not None:
                continue  # not started yet, or exited (handled by the exit check)
            age = now - beat["time"]
            if age > r.liveness_timeout_s:
                return Failure("stale_heartbeat", rank, f"no heartbeat for {age:.1f}s (stopped or hung)")
            beats[rank] = beat
        everyone_training = len(beats) == len(procs) and all(b["phase"] == "train" for b in beats.values())
        for rank, beat in beats.items():
            step, phase, since = progress.get(rank, (beat["step"], beat["phase"], now))
            if (beat["step"], beat["phase"]) != (step, phase) or (phase == "train" and not everyone_training):
                step, phase, since = beat["step"], beat["phase"], now
            progress[rank] = (step, phase, since)
            if phase == "train" and now - since > r.hang_timeout_s:
                return Failure("no_progress", rank, f"step {step} has not advanced for {now - since:.1f}s")
            if phase == "shutdown" and now - since > r.collective_timeout_s + 30.0:
                return Failure("stuck_in_shutdown", rank, f"still shutting down after {now - since:.1f}s")
        return None

    def _watch(self, procs: list[subprocess.Popen]) -> tuple[str, Failure | None]:
        """Return ("completed" | "requeue" | "failed", failure)."""
        forwarded = False
        progress: dict[int, tuple[int, str, float]] = {}
        ok_codes = {0, self.requeue_code, self.requeue_code + 1}
        while True:
            if self.signalled and not forwarded:
                for proc in procs:
                    if proc.poll() is None:
                        proc.send_signal(signal.Signals[self.signalled])
                forwarded = True
                self.events.write({"event": "signal_forwarded", "signal": self.signalled})
            codes = {i: p.poll() for i, p in enumerate(procs)}
            bad = {i: c for i, c in codes.items() if c is not None and c not in ok_codes}
            if bad:
                killed = [i for i, c in bad.items() if c < 0]  # died of a signal: the likely origin
                rank = (killed or sorted(bad))[0] + self.spec.node_rank * self.spec.nproc
                return "failed", Failure("process_exit", rank, f"exit codes {bad}", codes)
            if all(c is not None for c in codes.values()):
                if all(c == 0 for c in codes.values()):
                    return "completed", None
                return "requeue", None
            if self.cfg.resilience.heartbeat:
                failure = self._check_heartbeats(procs, progress)
                if failure is not None:
                    failure.exit_codes = codes
                    return "failed", failure
            time.sleep(POLL_S)

    def _teardown(self, procs: list[subprocess.Popen]) -> None:
        """Kill every survivor now: after a failure nothing they do is worth waiting for (the newest
        committed checkpoint is the restart point), and SIGKILL also ends a SIGSTOPped process."""
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait()

    # --- the restart loop --------------------------------------------------------------------------

    def run(self) -> int:
        self.events.write(
            {
                "event": "supervisor_start",
                "nproc": self.spec.nproc,
                "nnodes": self.spec.nnodes,
                "max_restarts": self.spec.max_restarts,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"),
            }
        )
        restarts = 0
        while True:
            procs = self._spawn(self.first_attempt + restarts)
            outcome, failure = self._watch(procs)
            if failure is not None:
                detected = time.time()
                self.events.write(
                    {
                        "event": "failure_detected",
                        "kind": failure.kind,
                        "rank": failure.rank,
                        "detail": failure.detail,
                        "exit_codes": {str(k): v for k, v in failure.exit_codes.items()},
                        "detected_at": detected,
                    }
                )
                self._teardown(procs)
                self.events.write({"event": "teardown_complete", "teardown_s": time.time() - detected})
            else:
                for proc in procs:
                    proc.wait()
            if outcome == "completed":
                self.events.write({"event": "supervisor_end", "outcome": "completed", "restarts": restarts})
                return 0
            if self.signalled:
                # We are being preempted ourselves: the scheduler requeues the whole job.
                self.events.write({"event": "supervisor_end", "outcome": "requeue", "restarts": restarts})
                return self.requeue_code
            if restarts >= self.spec.max_restarts:
                self.events.write({"event": "supervisor_end", "outcome": "gave_up", "restarts": restarts})
                return self.requeue_code if outcome == "requeue" else 1
            restarts += 1
            self.events.write({"event": "restart", "restart": restarts, "after": outcome})


def run_supervisor(spec: LaunchSpec, cfg: JobConfig) -> int:
    supervisor = Supervisor(spec, cfg)
    try:
        return supervisor.run()
    finally:
        supervisor.events.close()
