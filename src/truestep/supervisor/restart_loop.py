"""The local supervisor behind `truestep launch`: holds the run directory lease, runs the ranks of one
node, watches them (supervisor/watch.py), tears the job down promptly on a failure or hang, and restarts
it like a SLURM requeue would.

Why not torchrun's elastic agent: it never notices a hung rank, its file-timer watchdog takes itself down
too, and restarting gloo ranks at different times needs a workaround. Here every attempt gets a fresh
rendezvous port (on one node), so nothing of the previous attempt's store survives into the next.

Attempts are numbered job-wide by the lease's incarnation: node 0 bumps it, the other nodes of a
multi-node job wait for the bump, so every node and every rank logs the same number for one attempt.
What a node cannot see in its own ranks -- another node gone, the job moved on -- is judged by
supervisor/nodes.py: after a local failure every node restarts in place, but when a whole node is gone
the survivors stop (exit 77) so that the scheduler requeues the job onto healthy nodes.
Ranks run in their own session (a Ctrl-C reaches only the supervisor, which forwards it exactly once)
and die with the supervisor (resilience/orphan.py). A restarted rank is a warm standby handed its rank
when one is parked for its slot (supervisor/standby.py), else a fresh process.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from truestep.config.schema import JobConfig
from truestep.core.errors import ExitCode, FencedError, Outcome, TruestepError
from truestep.core.fsio import make_dir
from truestep.core.launch import Launch
from truestep.core.names import EVENTS_FILE
from truestep.faults.hooks import arm as arm_faults
from truestep.faults.spec import parse_faults
from truestep.resilience.lease import RunDirLease
from truestep.supervisor.driver import DriverFactory, ProcessDriver, RankDriver
from truestep.supervisor.memory_loss import forget_memory
from truestep.supervisor.nodes import JobNodes
from truestep.supervisor.standby import StandbyPool
from truestep.supervisor.watch import AttemptEnd, Failure, FailureKind
from truestep.telemetry.narrate import NarratedWriter, Narrator


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
    launch: Launch = field(default_factory=Launch)
    """The supervisor's own launch record (`truestep launch` reads it from its environment): what its
    ranks' records inherit (faults, job start, generation, debug)."""


def node_launch(spec: LaunchSpec, job_start: float, run_dir: Path) -> Launch:
    """What the launch record of every rank of this node holds, whatever its slot and attempt: the
    supervisor's own record (faults, generation, debug) with the job, the node and this supervisor."""
    return spec.launch.for_rank(
        world_size=spec.nproc * spec.nnodes,
        local_world_size=spec.nproc,
        node=spec.node_rank,
        master_addr=spec.master_addr,
        job=spec.job_id,
        job_start=job_start,
        supervisor_pid=os.getpid(),
        run_dir=str(run_dir),
    )


class Supervisor:
    def __init__(self, spec: LaunchSpec, cfg: JobConfig, driver: DriverFactory | None = None) -> None:
        self.spec = spec
        self.cfg = cfg
        self.run_dir = Path(cfg.run.dir)
        make_dir(self.run_dir)
        generation = spec.launch.generation
        self.lease = RunDirLease(self.run_dir, spec.job_id, cfg.resilience.lease_ttl_s, generation)
        self.nodes = JobNodes(
            self.run_dir,
            spec.job_id,
            spec.node_rank,
            spec.nnodes,
            spec.master_addr,
            cfg.resilience,
            generation=generation,
        )
        hub_port = self.nodes.hub_port  # published in the lease for the other nodes
        taken_over = self.lease.acquire(hub_port) if spec.node_rank == 0 else None  # refuses a second job
        self.nodes.publish_key()  # node 0: the link's secret, only once the run directory is this job's
        self.events = NarratedWriter(
            self.run_dir / EVENTS_FILE,
            {"source": "supervisor", "node": spec.node_rank, "host": socket.gethostname()},
            Narrator("truestep launch", enabled=cfg.metrics.narrate),
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
        self.longest_step_s = 0.0
        """The longest training step this launch has timed (resilience.hang_step_multiple)."""
        self.outcome = "error"
        """How the supervisor ended (supervisor_end's outcome), told to the other nodes."""
        self.job_start = spec.launch.job_start or time.time()
        self.node_launch = node_launch(spec, self.job_start, self.run_dir)
        # The supervisor's own fault point (teardown) fires from the same specs its ranks get.
        arm_faults(parse_faults(self.node_launch.faults), self.node_launch)
        self.driver: RankDriver = (driver or ProcessDriver)(self)
        """Spawns and watches each attempt's ranks (supervisor/driver.py)."""
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

    def _end(self, outcome: str, restarts: int, code: int, failure: Failure | None = None) -> int:
        """`failure`: one detected while the job stopped (a rank died in its emergency save): the end
        says so, since its checkpoint may then not have been saved."""
        self.outcome = outcome
        record = {"event": "supervisor_end", "attempt": self.attempt, "outcome": outcome, "restarts": restarts,
                  "exit_code": code, "link_refused": self.nodes.link_refused,
                  "link_errors": self.nodes.link_errors}  # fmt: skip
        if failure is not None:
            record["after_failure"] = restart_reason(AttemptEnd(Outcome.FAILED, failure), self.requeue_code)
        self.events.write(record)
        return code

    def _memory_lost(self, failure: Failure) -> None:
        """The failed ranks' snapshot memory goes with them (supervisor/memory_loss.py)."""
        try:
            forgotten = forget_memory(self.cfg.resilience, self.run_dir, failure)
        except (OSError, TruestepError) as err:  # the next attempt would restore them from their own: say so
            self.events.write({"event": "memory_loss_failed", "attempt": self.attempt, "error": str(err)})
            return
        if forgotten:
            self.events.write({"event": "memory_lost", "attempt": self.attempt, "ranks": forgotten})

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
            if self.signalled or self.interrupts:
                # The notice came during the recovery, before the ranks: they would restore the newest
                # commit only to save it again. Stop now; the requeue resumes from that same commit.
                stop = (
                    ("requeue", self.requeue_code)
                    if self.signalled
                    else ("interrupted", ExitCode.INTERRUPTED)
                )
                self.events.write(
                    {"event": "stopped_before_spawn", "attempt": self.attempt, "outcome": stop[0]}
                )
                return self._end(stop[0], restarts, stop[1])
            ranks = self.driver.spawn(self.attempt)
            end = self.driver.watch(ranks)
            torn_down = end.code is None and end.outcome in (Outcome.FENCED, Outcome.INTERRUPTED)
            if end.failure is not None or torn_down:
                detected, since = time.time(), time.monotonic()
                if end.failure is not None:
                    self._failure_detected(end.failure, detected)
                self.driver.teardown(ranks)
                self.events.write(
                    {
                        "event": "teardown_complete",
                        "attempt": self.attempt,
                        "teardown_s": time.time() - detected,
                    }
                )
                if end.failure is not None:
                    self._memory_lost(end.failure)
                if end.failure is not None and end.failure.kind != FailureKind.NODE_LOST:
                    end = self._before_restart(end, since)
            else:
                self.driver.wait(ranks)
            stop = self._decide(end, restarts)
            if stop is not None:
                return self._end(*stop)
            restarts += 1
            reason = restart_reason(end, self.requeue_code)
            self.events.write({"event": "restart", "restart": restarts, "after": end.word, "reason": reason})

    def _decide(self, end: AttemptEnd, restarts: int) -> tuple[str, int, int, Failure | None] | None:
        """The restart loop's one table: how the supervisor ends after an attempt, by the attempt's
        Outcome -- (outcome word, restarts, exit code, a failure met on the way) -- or None: restart."""
        failure = end.failure
        match end.outcome:
            case Outcome.CLEAN if end.code is None:
                return "completed", restarts, ExitCode.OK, None
            case Outcome.FENCED if end.code is None:
                print(f"truestep launch: {self.lost_lease}", file=sys.stderr, flush=True)
                return "fenced", restarts, ExitCode.FENCED, None
            case Outcome.NODE_LOST if end.code is None and failure is not None and failure.loss is not None:
                print(
                    f"truestep launch: {failure.detail}; stopping for a requeue", file=sys.stderr, flush=True
                )
                return "node_lost", restarts, failure.loss.exit_code(self.requeue_code), None
        if (end.outcome == Outcome.INTERRUPTED and end.code is None) or self.interrupts:
            return "interrupted", restarts, ExitCode.INTERRUPTED, None
        if end.code is not None:  # a refusal, a fence or a refusing filesystem: no attempt can change it
            return "refused", restarts, end.code, None
        if self.signalled:  # we are being preempted ourselves: the scheduler requeues the whole job
            return "requeue", restarts, self.requeue_code, failure
        if restarts >= self.spec.max_restarts:
            code = self.requeue_code if end.outcome == Outcome.REQUEUE else ExitCode.FAILURE
            return "gave_up", restarts, code, None
        return None

    def _before_restart(self, end: AttemptEnd, since: float) -> AttemptEnd:
        """A local failure: restart in place only while the job is still ours and every node is there."""
        try:
            lost = self.nodes.before_restart(self.attempt, since)
        except FencedError as err:
            self.lost_lease = err
            return AttemptEnd(Outcome.FENCED)
        if lost is None or lost.kind != FailureKind.NODE_LOST:
            return end
        self._failure_detected(lost, lost.loss.at if lost.loss else time.time())
        return AttemptEnd(Outcome.NODE_LOST, lost)


def restart_reason(end: AttemptEnd, requeue_code: int) -> str:
    """Why the supervisor restarts the attempt (the restart event's `reason`, said on the console)."""
    if end.failure is not None:
        where = f" on rank {end.failure.rank}" if end.failure.rank is not None else ""
        return f"{end.failure.kind}{where}"
    if end.word == "requeue":
        # Every rank ended in order with the requeue code while this supervisor got no signal itself:
        # the notice went to the ranks alone (e.g. a SIGTERM to one rank); the job is not being requeued.
        return (
            f"every rank stopped gracefully with exit {requeue_code} (a preemption signal reached the "
            "ranks, not this supervisor)"
        )
    return str(end.word)


def run_supervisor(spec: LaunchSpec, cfg: JobConfig, driver: DriverFactory | None = None) -> int:
    """The supervisor's run and end, whatever happens: standbys closed, the other nodes told, the lease
    released. `driver`: how ranks are spawned and watched (tests pass a script; default: processes)."""
    supervisor = Supervisor(spec, cfg, driver)
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
