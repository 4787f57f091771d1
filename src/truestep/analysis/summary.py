"""Everything the instrument reports about runs and experiments, as typed results.

`analyze_run` is one run (comparison, verdict, goodput, MTTR, checkpoint overhead); `analyze_group` is
one reference with its floor repeats, faulted runs and ablation cells; an `ExperimentSummary` is one or
more groups (the demo has two: the exact floor and the emulated nonzero floor) and the experiment's
verdict. The report, the CLI text and summary.json are all drawn from these objects; `to_json` writes
them with non-finite floats as strings, so strict JSON readers parse it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from dataclasses import dataclass
from typing import Any

from truestep.analysis.fidelity import DEFAULT_MARGIN, Comparison, check_comparable, compare
from truestep.analysis.floor import FloorModel, measure_floor
from truestep.analysis.goodput import CheckpointOverhead, Goodput, checkpoint_overhead, goodput
from truestep.analysis.mttr import Incident, incidents
from truestep.analysis.restores import restore_events
from truestep.analysis.runlog import RunLog
from truestep.analysis.self_check import self_check_label
from truestep.analysis.state import distances
from truestep.analysis.verdict import (
    UNCHECKED,
    CellVerdict,
    ExperimentVerdict,
    RunVerdict,
    judge,
    judge_experiment,
)


@dataclass
class RunAnalysis:
    name: str
    path: str
    role: str
    """reference, floor, faulted, ablation or run."""
    faults: list[str]
    resumes: int
    """Attempts that resumed (from a checkpoint or from peers' memory)."""
    comparison: Comparison | None
    verdict: RunVerdict
    goodput: Goodput
    incidents: list[Incident]
    checkpoint: CheckpointOverhead
    self_check: str = "-"
    """What the run's resumes said about themselves, with no reference (analysis/self_check.py)."""
    peak_mem_bytes_per_rank: list[int] = dataclasses.field(default_factory=list)
    """Each rank's measured memory peak at the end of the last attempt (run_end); empty: not recorded."""
    memory_estimate_bytes: int | None = None
    """The peak per rank estimated before the last attempt built its model (memory_estimate)."""
    evals: list[tuple[int, float, float]] = dataclasses.field(default_factory=list)
    """Held-out evaluations (step, loss, perplexity), the last one logged for each step."""

    @property
    def mean_mttr_s(self) -> float | None:
        values = [i.mttr_s for i in self.incidents if i.mttr_s is not None]
        return sum(values) / len(values) if values else None


@dataclass
class GroupSummary:
    name: str
    """"" for an experiment's main group; e.g. `emulated` for the demo's nonzero-floor group."""
    note: str
    """What sets the group apart (e.g. the emulator scale), shown in the report."""
    reference: str
    floor: FloorModel
    runs: dict[str, RunAnalysis]
    cells: list[CellVerdict]
    verdict: ExperimentVerdict


@dataclass
class ExperimentSummary:
    margin: float
    groups: list[GroupSummary]
    verdict: ExperimentVerdict


def analyze_run(
    name: str,
    run: RunLog,
    ref: RunLog | None,
    floor: FloorModel | None,
    role: str = "run",
    read_state: bool = True,
    comparison: Comparison | None = None,
    compare_anyway: bool = False,
) -> RunAnalysis:
    """One run against its reference and floor (without a reference: goodput and MTTR only).
    `comparison`: the run's comparison with `ref` when already made (a floor repeat's). A run of another
    experiment (its first attempt's config is not the reference's) is refused unless `compare_anyway`."""
    verdict = UNCHECKED
    if ref is not None:
        if not compare_anyway:
            check_comparable(run, ref)
        floor = floor or measure_floor(ref, [], read_state=read_state)
        if comparison is None:
            steps = floor.state_steps if read_state else []
            comparison = compare(
                run, ref, (distances(run.path, ref.path, steps) if steps else []) if read_state else None
            )
        verdict = judge(comparison, floor)
    uncounted = set(comparison.unverifiable_steps) | set(comparison.foreign_steps) if comparison else set()
    return RunAnalysis(
        name=name,
        path=str(run.path),
        role=role,
        faults=run.fault_specs(),
        resumes=len({e.get("attempt") for e in restore_events(run)}),
        comparison=comparison,
        verdict=verdict,
        goodput=goodput(run, verdict.first_uncounted_step, uncounted),
        incidents=incidents(run),
        checkpoint=checkpoint_overhead(run),
        self_check=self_check_label(run),
        **training_facts(run),
    )


def training_facts(run: RunLog) -> dict[str, Any]:
    """Memory and held-out evaluation, as the run logged them (run_end, memory_estimate, eval)."""
    ends, estimates = run.named("run_end"), run.named("memory_estimate")
    peaks = ends[-1].get("peak_mem_bytes_per_rank") if ends else None
    estimate = estimates[-1].get("peak_bytes") if estimates else None
    evals = {
        e["step"]: (e["step"], float(e["loss"]), float(e["perplexity"]))
        for e in run.named("eval")
        if isinstance(e.get("loss"), int | float) and isinstance(e.get("perplexity"), int | float)
    }
    return {
        "peak_mem_bytes_per_rank": [int(p) for p in peaks if isinstance(p, int)]
        if isinstance(peaks, list)
        else [],
        "memory_estimate_bytes": int(estimate) if isinstance(estimate, int) else None,
        "evals": [evals[step] for step in sorted(evals)],
    }


def analyze_group(
    ref_name: str,
    ref: RunLog,
    floors: dict[str, RunLog],
    others: dict[str, tuple[str, RunLog]],
    cells: list[tuple[str, str, str]],
    margin: float = DEFAULT_MARGIN,
    name: str = "",
    note: str = "",
    read_state: bool = True,
) -> GroupSummary:
    """A reference, its floor repeats, and other runs by name -> (role, log); `cells` are the ablation
    cells as (row, mode, run name) naming runs of `others`."""
    floor = measure_floor(ref, list(floors.values()), margin, read_state)
    runs = {ref_name: analyze_run(ref_name, ref, None, None, "reference")}
    made = dict(zip(floor.repeats, floor.comparisons, strict=True))
    for floor_name, log in floors.items():
        runs[floor_name] = analyze_run(
            floor_name, log, ref, floor, "floor", read_state, made.get(str(log.path))
        )
    for run_name, (role, log) in others.items():
        runs[run_name] = analyze_run(run_name, log, ref, floor, role, read_state)
    judged = [CellVerdict(row, mode, run, runs[run].verdict) for row, mode, run in cells]
    faulted = {n: r.verdict for n, r in runs.items() if r.role == "faulted"}
    return GroupSummary(name, note, ref_name, floor, runs, judged, judge_experiment(faulted, judged))


def summarize_groups(groups: list[GroupSummary], margin: float = DEFAULT_MARGIN) -> ExperimentSummary:
    """The experiment's verdict over every group: FAIL if any group fails."""
    faulted = {
        f"{g.name}/{n}" if g.name else n: r.verdict
        for g in groups
        for n, r in g.runs.items()
        if r.role == "faulted"
    }
    cells = [c for g in groups for c in g.cells]
    return ExperimentSummary(margin, groups, judge_experiment(faulted, cells))


def _plain(value: Any) -> Any:
    if isinstance(value, RunVerdict):
        out = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        out.update(
            label=value.label,
            preserving=value.preserving,
            first_violation_step=value.first_violation_step,
            exit_code=value.exit_code,
        )
        return out
    if isinstance(value, Comparison):
        out = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for derived in (
            "max_dloss",
            "mean_dloss",
            "max_dgrad_norm",
            "fraction_bitwise_equal",
            "first_divergent_step",
            "config_differs",
        ):
            out[derived] = _plain(getattr(value, derived))
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def to_json(value: Any) -> str:
    """Strict JSON of any result above (non-finite floats as "inf"/"nan" strings)."""
    return json.dumps(_plain(value), indent=1, allow_nan=False)
