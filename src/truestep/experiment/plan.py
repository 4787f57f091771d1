"""An experiment: the reference, the same-seed repeat (floor), the faulted run(s) and optionally the
ablation matrix, run through the local supervisor, then analysed into summary.json and a report.

Directory layout:
  OUT/experiment.json      the plan (config, overrides, jobs with their faults)
  OUT/runs/<job>/          one run directory per job (metrics.jsonl, events.jsonl, checkpoints/)
  OUT/logs/<job>.log       the supervisor's and ranks' console output
  OUT/summary.json         every measure (analysis/summary.py)
  OUT/report.md, report.html, plots/*.png
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from truestep.analysis.fidelity import DEFAULT_MARGIN, floor
from truestep.analysis.runlog import RunLog
from truestep.analysis.summary import analyze
from truestep.experiment.runner import JobSpec, run_job

# Ablation rows: the switches that turn one mechanism off (docs/checkpointing.md, docs/measures.md).
ABLATION_ROWS: dict[str, list[str]] = {
    "all-on": [],
    "optimizer-restore-off": ["--checkpoint.restore_optimizer_state=false"],
    "rng-restore-off": ["--checkpoint.restore_rng_state=false"],
    "data-position-off": ["--checkpoint.restore_data_position=false"],
    "atomic-commit-off": ["--checkpoint.atomic_commit=false"],
}
ABLATION_MODES = ("graceful", "hard")


def ablation_faults(row: str, mode: str, step: int, interval: int, nproc: int) -> list[str]:
    """The fault of one matrix cell. The atomic-commit row needs a crash inside a save (that is when a
    torn checkpoint exists): the preemption's kill lands mid-save (graceful) or a crash hits an
    interval save (hard)."""
    victim = 1 if nproc > 1 else 0
    save_step = max(interval, (step // interval) * interval)
    if row == "atomic-commit-off":
        if mode == "graceful":
            # The ranks stop at the first step boundary after the signal: step or step + 1.
            return [f"term:step={step}", f"crash-in-save:phase=mid-shards:from={step}:rank=0"]
        return [f"crash-in-save:phase=mid-shards:step={save_step}:rank=0"]
    if mode == "graceful":
        return [f"term:step={step}"]
    return [f"kill:rank={victim}:step={step}"]


def plan_jobs(
    config: str,
    overrides: list[str],
    nproc: int,
    faults: list[str],
    ablation: bool,
    ablation_rows: list[str] | None = None,
    ablation_modes: list[str] | None = None,
    fault_step: int = 13,
    interval: int = 5,
) -> list[JobSpec]:
    jobs = [JobSpec("reference", config, overrides, nproc), JobSpec("floor", config, overrides, nproc)]
    if faults:
        jobs.append(JobSpec("faulted", config, overrides, nproc, faults))
    if ablation:
        for row in ablation_rows or list(ABLATION_ROWS):
            for mode in ablation_modes or list(ABLATION_MODES):
                cell = ablation_faults(row, mode, fault_step, interval, nproc)
                jobs.append(
                    JobSpec(f"ablation-{row}-{mode}", config, overrides + ABLATION_ROWS[row], nproc, cell)
                )
    return jobs


def run_plan(out: Path, jobs: list[JobSpec], progress: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    (out / "experiment.json").write_text(json.dumps({"jobs": [asdict(j) for j in jobs]}, indent=1))
    for index, job in enumerate(jobs, 1):
        run_dir = out / "runs" / job.name
        if (run_dir / "metrics.jsonl").exists():
            raise FileExistsError(f"{run_dir} already holds a run; use a fresh --out directory")
        started = time.time()
        if progress:
            print(f"[{index}/{len(jobs)}] {job.name}  faults: {'; '.join(job.faults) or 'none'}", flush=True)
        code = run_job(job, run_dir, log=out / "logs" / f"{job.name}.log")
        if progress:
            print(f"        exit {code} after {time.time() - started:.1f}s", flush=True)


def summarize(out: Path, margin: float = DEFAULT_MARGIN) -> dict[str, Any]:
    """Analyse every run of an experiment directory against its reference and floor."""
    plan = json.loads((out / "experiment.json").read_text())
    runs = {job["name"]: RunLog.load(out / "runs" / job["name"]) for job in plan["jobs"]}
    ref, repeat = runs["reference"], runs["floor"]
    base = floor(repeat, ref)
    summary: dict[str, Any] = {
        "margin": margin,
        "floor": asdict(base),
        "runs": {name: analyze(run, ref, base, margin) for name, run in runs.items()},
    }
    summary["ablation"] = [
        _ablation_cell(row, mode, summary["runs"][f"ablation-{row}-{mode}"])
        for row in ABLATION_ROWS
        for mode in ABLATION_MODES
        if f"ablation-{row}-{mode}" in summary["runs"]
    ]
    (out / "summary.json").write_text(json.dumps(_strict_json(summary), indent=1, default=str))
    return summary


def _ablation_cell(row: str, mode: str, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "row": row,
        "mode": mode,
        "run": f"ablation-{row}-{mode}",
        "flagged": not result["preserving"],
        "first_divergent_step": result["fidelity"]["first_divergent_step"],
        "first_violation_step": result["first_violation_step"],
        "plain_tokens_per_s": result["goodput"]["plain_tokens_per_s"],
        "correct_tokens_per_s": result["goodput"]["correct_tokens_per_s"],
    }


def _strict_json(value: Any) -> Any:
    """Non-finite floats (a NaN loss, an infinite deviation) as strings, so strict readers parse it."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict_json(v) for v in value]
    return value
