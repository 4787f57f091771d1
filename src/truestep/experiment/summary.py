"""Analyse an experiment directory: every group's runs against its reference and measured floor, plus
the ablation cells, into OUT/summary.json (the report is drawn from the returned ExperimentSummary).

The experiment room only says which run plays which role (from experiment.json); every measure and
verdict is computed by the analysis room."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from truestep.analysis.fidelity import DEFAULT_MARGIN
from truestep.analysis.runlog import RunLog, RunLogError
from truestep.analysis.summary import ExperimentSummary, analyze_group, summarize_groups, to_json
from truestep.core.fsio import atomic_write
from truestep.experiment.plan import ABLATION_MODES, ROWS
from truestep.experiment.runner import GROUP_NOTES


def _with_role(job: dict[str, Any]) -> dict[str, Any]:
    """A job of an experiment.json written before jobs carried their role: inferred from its name."""
    name = job["name"]
    if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
        raise ValueError(f"job name {name!r} is not a plain directory name under runs/")
    if "role" in job:
        return job
    for row in ROWS:
        for mode in ABLATION_MODES:
            if name == f"ablation-{row}-{mode}":
                return {**job, "role": "ablation", "row": row, "mode": mode}
    role = next((r for r in ("reference", "floor", "faulted") if name.startswith(r)), "run")
    return {**job, "role": role}


def _jobs(out: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    try:
        plan = json.loads((out / "experiment.json").read_text())
        jobs = [_with_role(job) for job in plan["jobs"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RunLogError(f"{out} is not an experiment directory (experiment.json: {err})") from err
    return jobs, dict(plan.get(GROUP_NOTES) or {})


def summarize(
    out: Path, margin: float = DEFAULT_MARGIN, read_state: bool = True, write: bool = True
) -> ExperimentSummary:
    """Analyse every group of an experiment directory; writes OUT/summary.json unless `write` is false
    (a reader such as `truestep plan --from` leaves the directory as it found it)."""
    jobs, notes = _jobs(out)
    groups = []
    for group in dict.fromkeys(job.get("group", "") for job in jobs):
        mine = [job for job in jobs if job.get("group", "") == group]
        logs = {job["name"]: RunLog.load(out / "runs" / job["name"]) for job in mine}
        refs = [job["name"] for job in mine if job.get("role") == "reference"]
        if len(refs) != 1:
            raise RunLogError(
                f"{out}: group {group or '(main)'} needs exactly one reference, has {len(refs)}"
            )
        floors = {job["name"]: logs[job["name"]] for job in mine if job.get("role") == "floor"}
        others = {
            job["name"]: (job.get("role", "run"), logs[job["name"]])
            for job in mine
            if job.get("role") not in ("reference", "floor")
        }
        cells = [(job["row"], job["mode"], job["name"]) for job in mine if job.get("role") == "ablation"]
        declared = {job["name"]: [str(f) for f in job.get("faults") or []] for job in mine}
        groups.append(
            analyze_group(
                refs[0],
                logs[refs[0]],
                floors,
                others,
                cells,
                margin,
                group,
                notes.get(group, ""),
                read_state,
                declared,
            )
        )
    summary = summarize_groups(groups, margin)
    if write:
        atomic_write(out / "summary.json", to_json(summary).encode())
    return summary
