"""An experiment's plan: the reference, K same-seed repeats (the floor), the faulted run(s) and optionally
the ablation matrix, in one or more groups (runner.py runs it through the local supervisor; summary.py
analyses it). A group is one reference with its own floor: the demo adds a group whose runs emulate
GPU nondeterminism (`train.emulate_nondeterminism`), where the floor is not zero.

Directory layout:
  OUT/experiment.json      the plan (every job with its role, group, faults and overrides)
  OUT/runs/<job>/          one run directory per job (metrics.jsonl, events.jsonl, checkpoints/)
  OUT/logs/<job>.log       the supervisor's and ranks' console output
  OUT/summary.json         every measure (experiment/summary.py)
  OUT/report.md, report.html, plots/*.png
"""

from __future__ import annotations

from truestep.analysis.verdict import COST_ROWS
from truestep.config.load import load_config
from truestep.experiment.runner import JobSpec

# Ablation rows: the switches that turn one mechanism off (docs/checkpointing.md, docs/measures.md).
ABLATION_ROWS: dict[str, list[str]] = {
    "all-on": [],
    "optimizer-restore-off": ["--checkpoint.restore_optimizer_state=false"],
    "rng-restore-off": ["--checkpoint.restore_rng_state=false"],
    "data-position-off": ["--checkpoint.restore_data_position=false"],
    "atomic-commit-off": ["--checkpoint.atomic_commit=false"],
}
SNAPSHOT_ROWS: dict[str, list[str]] = {"peer-snapshots-off": ["--resilience.snapshot_every_steps=0"]}
"""Ablation rows of a mechanism of cost, added when the base config has it on: peer snapshots
(resilience.snapshot_every_steps > 0) off, so a failure recovers from disk. Such a cell must stay
trajectory-preserving (it is judged like all-on, analysis/verdict.py COST_ROWS) and shows what the
mechanism buys: steps lost per failure and MTTR beside the all-on cell's."""
assert set(SNAPSHOT_ROWS) == COST_ROWS, "a cost row the verdict does not judge like all-on"
ROWS = {**ABLATION_ROWS, **SNAPSHOT_ROWS}
"""Every row an experiment may run: ABLATION_ROWS always, SNAPSHOT_ROWS when snapshots are on."""
ABLATION_MODES = ("graceful", "hard")
DEFAULT_REPEATS = 3
"""Same-seed repeats for the floor: two is the fewest leave-one-out can use; three measurably lowers
the false-positive rate (docs/measures.md)."""


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


def default_rows(config: str, overrides: list[str]) -> list[str]:
    """The ablation rows of an experiment on this config: every correctness row, and the peer-snapshots
    row when the base config takes snapshots (without them the row would repeat all-on)."""
    rows = list(ABLATION_ROWS)
    if load_config(config, overrides).resilience.snapshot_every_steps > 0:
        rows += list(SNAPSHOT_ROWS)
    return rows


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
    repeats: int = DEFAULT_REPEATS,
    group: str = "",
    nnodes: int = 1,
) -> list[JobSpec]:
    """The jobs of one group; a group's job names start with `<group>-` (none for the main group).
    Every job runs `nproc` ranks on each of `nnodes` nodes (multi-node jobs: runner.py)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1 (the floor needs a same-seed repeat), got {repeats}")
    prefix = f"{group}-" if group else ""

    def job(
        name: str, role: str, extra: list[str] | None = None, cell: list[str] | None = None, **kw: str
    ) -> JobSpec:
        return JobSpec(
            prefix + name,
            config,
            overrides + (extra or []),
            nproc,
            cell or [],
            role=role,
            group=group,
            nnodes=nnodes,
            **kw,
        )

    jobs = [job("reference", "reference")]
    jobs += [job(f"floor-{k}", "floor") for k in range(1, repeats + 1)]
    if faults:
        jobs.append(job("faulted", "faulted", cell=faults))
    if ablation:
        for row in ablation_rows or default_rows(config, overrides):
            for mode in ablation_modes or list(ABLATION_MODES):
                cell = ablation_faults(row, mode, fault_step, interval, nproc * nnodes)
                jobs.append(job(f"ablation-{row}-{mode}", "ablation", ROWS[row], cell, row=row, mode=mode))
    return jobs
