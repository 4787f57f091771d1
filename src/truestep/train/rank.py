"""A rank's front door: `run_rank(cfg, launch)` runs one rank's whole life and returns its exit code.

`truestep train` (a fresh rank, a warm standby after its handoff, a torchrun worker) loads the config
and the launch record (core/launch.py) and calls this; only the CLI turns the code into the process
exit, so a test can run a rank in-process and look at what it returns.

In order: the record must match the config (a supervised rank trains in its supervisor's run
directory); faults are armed; a supervised rank checks that the lease still names its attempt and
starts its heartbeat -- all before torch is imported, so a rank that stops while importing is visible to
the supervisor's start-up deadline within a fraction of a second. Then train/run.py: the process group,
(without a supervisor) rank 0 begins the attempt, the trainer, the hooks, the loop, teardown.
"""

from __future__ import annotations

from pathlib import Path

from truestep.config.schema import JobConfig
from truestep.core.launch import Launch, LaunchError
from truestep.core.names import ENV_RUN_DIR
from truestep.core.status import Phase, RankStatus
from truestep.faults.hooks import arm, disarm, fault_point
from truestep.faults.hooks import set_context as set_fault_context
from truestep.faults.spec import parse_faults
from truestep.resilience.attempt import supervised_attempt
from truestep.resilience.heartbeat import Heartbeat


def run_rank(cfg: JobConfig, launch: Launch) -> int:
    """Train this rank to the end (or a stop) and return its exit code (docs/resilience.md); expected
    failures on the way are one line on stderr and their code. Never exits the process."""
    run_dir = Path(cfg.run.dir)
    if launch.run_dir and Path(launch.run_dir) != run_dir:
        raise LaunchError(
            f"the config's run.dir={run_dir} is not the run directory this rank was launched for "
            f"({ENV_RUN_DIR}={launch.run_dir})"
        )
    arm(parse_faults(launch.faults), launch)
    heartbeat: Heartbeat | None = None
    try:
        status = RankStatus()
        attempt = supervised_attempt(run_dir, launch)
        if attempt is not None:
            set_fault_context(run_dir=run_dir, attempt=attempt.number)
        fault_point("startup")
        if attempt is not None and cfg.resilience.heartbeat:
            interval = cfg.resilience.heartbeat_interval_s
            status.phase = Phase.LOADING
            heartbeat = Heartbeat(run_dir, launch.rank, attempt.number, status, interval, attempt.fence)
            heartbeat.start()
        from truestep.train.run import run_training  # torch and the model: after the first heartbeat

        status.phase = Phase.STARTUP
        if heartbeat is not None:  # seen before anything else happens (a forked rank restores at once)
            heartbeat.beat_now()
        return run_training(cfg, launch, status, attempt)
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        disarm()
