"""Run an experiment's jobs the way a preemptible cluster would: the local supervisor restarts failed ranks, and a
graceful preemption (exit 75) is requeued by relaunching the supervisor, as SLURM would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from truestep.config.load import load_config
from truestep.core.names import ENV_FAULTS, ENV_JOB_START, METRICS_FILE

GROUP_NOTES = "groups"
"""experiment.json key: group name -> the note the report shows for it."""


@dataclass
class JobSpec:
    name: str
    config: str
    overrides: list[str]
    nproc: int
    faults: list[str] = field(default_factory=list)
    role: str = "run"
    """reference, floor, faulted or ablation: how the summary treats the run."""
    group: str = ""
    """Runs of one group share a reference and floor (experiment/plan.py)."""
    row: str = ""
    """Ablation row (the mechanism switched off), for role ablation."""
    mode: str = ""
    """Ablation mode (graceful or hard), for role ablation."""
    max_restarts: int = 4
    max_requeues: int = 4
    requeue_delay_s: float = 1.0
    """Simulated scheduler wait between a requeue exit and the relaunch."""


def run_job(spec: JobSpec, run_dir: Path, log: Path | None = None) -> int:
    """Launch (and requeue) until the job finishes or gives up; return the last exit code."""
    requeue_code = load_config(spec.config, spec.overrides).resilience.requeue_exit_code
    env = dict(os.environ)
    env.pop(ENV_FAULTS, None)
    if spec.faults:
        env[ENV_FAULTS] = ";".join(spec.faults)
    env.setdefault("OMP_NUM_THREADS", "1")
    # One job clock across requeues, so time-based faults and attempts share a time origin.
    env[ENV_JOB_START] = str(time.time())
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


def run_plan(
    out: Path, jobs: list[JobSpec], progress: bool = True, notes: dict[str, str] | None = None
) -> None:
    """Run every job into OUT/runs/<name>; `notes`: group name -> what sets the group apart (the report
    shows it)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    plan = {"jobs": [asdict(j) for j in jobs], GROUP_NOTES: dict(notes or {})}
    (out / "experiment.json").write_text(json.dumps(plan, indent=1))
    for index, job in enumerate(jobs, 1):
        run_dir = out / "runs" / job.name
        if (run_dir / METRICS_FILE).exists():
            raise FileExistsError(f"{run_dir} already holds a run; use a fresh --out directory")
        started = time.time()
        if progress:
            print(f"[{index}/{len(jobs)}] {job.name}  faults: {'; '.join(job.faults) or 'none'}", flush=True)
        code = run_job(job, run_dir, log=out / "logs" / f"{job.name}.log")
        if progress:
            print(f"        exit {code} after {time.time() - started:.1f}s", flush=True)
