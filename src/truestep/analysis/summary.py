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
from truestep.analysis.provenance import check_owned, check_provenance, same_run
from truestep.analysis.restores import restore_events
from truestep.analysis.runlog import RunLog, RunLogError
from truestep.analysis.scenario import Scenario, scenario
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
    any_provenance: bool = False,
    declared_faults: list[str] | None = None,
) -> RunAnalysis:
    """One run against its reference and floor (without a reference: goodput and MTTR only).
    `comparison`: the run's comparison with `ref` when already made (a floor repeat's). A run of another
    experiment (its first attempt's config is not the reference's) is refused unless `compare_anyway`;
    one whose provenance (code, data, init source, torch) is not the reference's unless `any_provenance`
    (the verdict is then labelled). A run under test (role run, faulted, ablation) is judged on the
    recovery it claims: `declared_faults` (an experiment's job faults) and the faults it was armed with
    must have fired and it must have resumed (analysis/scenario.py); the reference itself, a copy of it,
    or (role run) a failure-free run is refused."""
    verdict = UNCHECKED
    if ref is not None:
        check_owned(run, role)
        if not compare_anyway:
            check_comparable(run, ref)
        if not any_provenance:
            check_provenance(run, ref, role)
        claims = scenario(run, declared_faults or []) if role in UNDER_TEST else None
        if claims is not None:
            _check_under_test(run, ref, role, claims)
        floor = floor or measure_floor(ref, [], read_state=read_state)
        if comparison is None:
            steps = floor.state_steps if read_state else []
            comparison = compare(
                run, ref, (distances(run.path, ref.path, steps) if steps else []) if read_state else None
            )
        verdict = judge(comparison, floor, claims)
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


UNDER_TEST = ("run", "faulted", "ablation")
"""Roles whose verdict is a claim about a recovery (analysis/scenario.py)."""


def _check_under_test(run: RunLog, ref: RunLog, role: str, claims: Scenario) -> None:
    """Refuse (exit 3) a run under test that cannot say anything about a recovery: the reference or a
    copy of it anywhere; a failure-free run where one run was asked about (in an experiment, what did not
    happen is a gap of its verdict instead)."""
    if same_run(run, ref):
        raise RunLogError(
            f"{role} {run.path} is the reference or a copy of it (same run id or the same attempts): "
            "comparing a run with itself says nothing about a recovery"
        )
    if role == "run" and claims.failure_free:
        unfired = f"; named but never fired: {'; '.join(claims.unfired)}" if claims.unfired else ""
        raise RunLogError(
            f"{run.path} is a failure-free run (no fault fired, no restart, no checkpoint restored{unfired}): "
            "a fidelity verdict is about a recovery; use it as a floor repeat (--floor) instead"
        )


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
    declared: dict[str, list[str]] | None = None,
) -> GroupSummary:
    """A reference, its floor repeats, and other runs by name -> (role, log); `cells` are the ablation
    cells as (row, mode, run name) naming runs of `others`; `declared`: run name -> the faults the
    experiment gave it."""
    floor = measure_floor(ref, list(floors.values()), margin, read_state)
    runs = {ref_name: analyze_run(ref_name, ref, None, None, "reference")}
    made = dict(zip(floor.repeats, floor.comparisons, strict=True))
    for floor_name, log in floors.items():
        runs[floor_name] = analyze_run(
            floor_name, log, ref, floor, "floor", read_state, made.get(str(log.path))
        )
    for run_name, (role, log) in others.items():
        faults = (declared or {}).get(run_name)
        runs[run_name] = analyze_run(run_name, log, ref, floor, role, read_state, declared_faults=faults)
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
