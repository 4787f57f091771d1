"""Analyse an experiment directory: every run against the reference and the measured floor, plus the
ablation matrix, into OUT/summary.json (the report reads it)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from truestep.analysis.fidelity import DEFAULT_MARGIN, floor
from truestep.analysis.runlog import RunLog
from truestep.analysis.summary import analyze
from truestep.experiment.plan import ABLATION_MODES, ABLATION_ROWS


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
