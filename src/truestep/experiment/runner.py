"""Run one job the way a preemptible cluster would: the local supervisor restarts failed ranks, and a
graceful preemption (exit 75) is requeued by relaunching the supervisor, as SLURM would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from truestep.faults.hooks import ENV_VAR as FAULTS_ENV


@dataclass
class JobSpec:
    name: str
    config: str
    overrides: list[str]
    nproc: int
    faults: list[str] = field(default_factory=list)
    max_restarts: int = 4
    max_requeues: int = 4
    requeue_delay_s: float = 1.0
    """Simulated scheduler wait between a requeue exit and the relaunch."""


def run_job(spec: JobSpec, run_dir: Path, requeue_code: int = 75, log: Path | None = None) -> int:
    """Launch (and requeue) until the job finishes or gives up; return the last exit code."""
    env = dict(os.environ)
    env.pop(FAULTS_ENV, None)
    if spec.faults:
        env[FAULTS_ENV] = ";".join(spec.faults)
    env.setdefault("OMP_NUM_THREADS", "1")
    # One job clock across requeues, so time-based faults and attempts share a time origin.
    env["TRUESTEP_JOB_START"] = str(time.time())
    cmd = [sys.executable, "-m", "truestep", "launch", spec.config, f"--nproc={spec.nproc}"]
    cmd += [f"--max-restarts={spec.max_restarts}", f"--run.dir={run_dir}", *spec.overrides]
    code = 1
    for _ in range(spec.max_requeues + 1):
        # The supervisor numbers attempts across requeues (from the run's events), so a fault armed
        # for restart=K fires in exactly one attempt of the whole job.
        with open(log or os.devnull, "a") as out:
            code = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
        if code != requeue_code:
            return code
        time.sleep(spec.requeue_delay_s)
    return code
