"""Run an experiment's jobs the way a preemptible cluster would: the local supervisor restarts failed ranks, and a
graceful preemption (exit 75) is requeued by relaunching the supervisor, as SLURM would.

With nnodes > 1 every launch is one supervisor per "node" on this machine (node ranks 0..N-1, one
rendezvous port, one job id), and the job is relaunched as a whole -- a new launch, as after a SLURM
requeue -- when a node stopped for a requeue: preempted (75, 76), a node lost (77), or a node crashed
(killed by a signal: `kill:node=K`). On a real cluster the scheduler does this (docs/slurm.md)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from truestep.config.load import load_config
from truestep.core.errors import Outcome
from truestep.core.names import ENV_FAULTS, ENV_JOB_GENERATION, ENV_JOB_START, METRICS_FILE
from truestep.faults.optin import ALLOW_FLAG

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
    nnodes: int = 1
    """Supervisors ("nodes") per launch, each running `nproc` ranks, all on this machine."""


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
    cmd += ["--metrics.progress=false"]  # the job's log is a file: a progress bar there is noise
    if spec.faults:
        cmd.append(ALLOW_FLAG)  # the faults above are this experiment's own, passed in the environment
    if spec.nnodes > 1:
        return _run_nodes(spec, cmd, env, run_dir, requeue_code, log)
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


def _run_nodes(
    spec: JobSpec, cmd: list[str], env: dict[str, str], run_dir: Path, requeue_code: int, log: Path | None
) -> int:
    """One supervisor per node, relaunched together while the job asks for a requeue: a node stopped
    for one (preempted, a node lost) or was killed (negative: a signal); not when it gave up (1)."""
    outcomes = {Outcome.REQUEUE, Outcome.NODE_LOST}
    job = f"experiment-{run_dir.name}-{os.getpid()}"
    codes = [1]
    for generation in range(spec.max_requeues + 1):
        with socket.socket() as probe:  # a fresh rendezvous port per launch (node 0 listens on it)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        nodes = [f"--nnodes={spec.nnodes}", f"--master-port={port}", f"--job-id={job}"]
        with open(log or os.devnull, "a") as out:
            procs = [
                subprocess.Popen(
                    [*cmd, *nodes, f"--node-rank={node}"],
                    env={**env, ENV_JOB_GENERATION: str(generation)},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
                for node in range(spec.nnodes)
            ]
            codes = [proc.wait() for proc in procs]
        if all(code == 0 for code in codes):
            return 0
        ended = [Outcome.of(code, requeue_code) for code in codes]
        refused = [code for code, outcome in zip(codes, ended, strict=True) if not outcome.requeue and code]
        if refused:
            return refused[0]
        if not any(outcome in outcomes or code < 0 for code, outcome in zip(codes, ended, strict=True)):
            return max(codes)  # the supervisors gave up
        time.sleep(spec.requeue_delay_s)
    return next((code for code in codes if code != 0), 1)


def eta_line(durations: list[float], total: int) -> str:
    """What is left after `len(durations)` of `total` jobs, estimated from the mean job so far. The report
    (reading every run's checkpoints) follows and is not in the estimate: the report phase says its own."""
    left = total - len(durations)
    if left <= 0:
        return "all runs done; the report comes next"
    estimate = sum(durations) / len(durations) * left
    return f"{left} run(s) left, about {_clock(estimate)} (then the report)"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def run_plan(
    out: Path, jobs: list[JobSpec], progress: bool = True, notes: dict[str, str] | None = None
) -> None:
    """Run every job into OUT/runs/<name>; `notes`: group name -> what sets the group apart (the report
    shows it)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    plan = {"jobs": [asdict(j) for j in jobs], GROUP_NOTES: dict(notes or {})}
    (out / "experiment.json").write_text(json.dumps(plan, indent=1))
    durations: list[float] = []
    for index, job in enumerate(jobs, 1):
        run_dir = out / "runs" / job.name
        if (run_dir / METRICS_FILE).exists():
            raise FileExistsError(f"{run_dir} already holds a run; use a fresh --out directory")
        started = time.time()
        if progress:
            print(f"[{index}/{len(jobs)}] {job.name}  faults: {'; '.join(job.faults) or 'none'}", flush=True)
        code = run_job(job, run_dir, log=out / "logs" / f"{job.name}.log")
        durations.append(time.time() - started)
        if progress:
            print(
                f"        exit {code} after {durations[-1]:.1f}s; {eta_line(durations, len(jobs))}",
                flush=True,
            )
