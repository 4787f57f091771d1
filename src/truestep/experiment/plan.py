"""An experiment's plan: the reference, the same-seed repeat (floor), the faulted run(s) and optionally
the ablation matrix (runner.py runs it through the local supervisor; summary.py analyses it).

Directory layout:
  OUT/experiment.json      the plan (config, overrides, jobs with their faults)
  OUT/runs/<job>/          one run directory per job (metrics.jsonl, events.jsonl, checkpoints/)
  OUT/logs/<job>.log       the supervisor's and ranks' console output
  OUT/summary.json         every measure (experiment/summary.py)
  OUT/report.md, report.html, plots/*.png
"""

from __future__ import annotations

from truestep.experiment.runner import JobSpec

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
    nnodes: int = 1,
) -> list[JobSpec]:
    """`nproc` ranks on each of `nnodes` nodes for every job (multi-node jobs: runner.py)."""
    jobs = [
        JobSpec("reference", config, overrides, nproc, nnodes=nnodes),
        JobSpec("floor", config, overrides, nproc, nnodes=nnodes),
    ]
    if faults:
        jobs.append(JobSpec("faulted", config, overrides, nproc, faults, nnodes=nnodes))
    if ablation:
        for row in ablation_rows or list(ABLATION_ROWS):
            for mode in ablation_modes or list(ABLATION_MODES):
                cell = ablation_faults(row, mode, fault_step, interval, nproc * nnodes)
                row_overrides = overrides + ABLATION_ROWS[row]
                jobs.append(
                    JobSpec(f"ablation-{row}-{mode}", config, row_overrides, nproc, cell, nnodes=nnodes)
                )
    return jobs
