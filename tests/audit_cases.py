"""Shared by the `truestep audit` tests: the trainers under tests/audit_trainers/, and an audit split
into its failure-free runs (made once per module: reference and floor) and one faulted run per test,
judged by the same functions `truestep audit` runs (audit/plan.py)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from truestep.analysis.summary import ExperimentSummary, RunAnalysis
from truestep.audit.plan import FAULTED, AuditPlan, judge, run_one, write_plan
from truestep.audit.spec import parse_fault, parse_logs

TRAINERS = Path(__file__).parent / "audit_trainers"
EXTRA_FLAGS = "AUDIT_TEST_FLAGS"
"""The trainers read more flags from this variable: given to the faulted run only, a misconfiguration
that matters only on resume leaves the shared failure-free runs what they would be with it."""


def needs(module: str) -> pytest.MarkDecorator:
    """Skip where `module` is not installed, found without importing it: the audited script imports it
    in its own process, and importing Lightning or accelerate here would cost every collection seconds."""
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


def command(script: str, *args: str) -> list[str]:
    return [sys.executable, str(TRAINERS / script), "{run_dir}", *args]


def make_plan(cmd: list[str], logs: str, weights: str | None = None, **kw: object) -> AuditPlan:
    return AuditPlan(cmd, parse_logs(logs), [], weights=weights, grace_s=5.0, timeout_s=300.0, **kw)  # type: ignore[arg-type]


JOBS = 2
"""Runs at a time: a framework's start-up (seconds of imports) dominates these runs, and two overlap on
two cores. Only the tests' wall clock changes: each run is its own process group, its verdict does not
depend on timing, and no test here asserts a duration."""


def failure_free(out: Path, plan: AuditPlan) -> Path:
    """The reference and the floor repeats of `plan` in `out`."""
    write_plan(out, plan)
    with ThreadPoolExecutor(JOBS) as pool:
        list(pool.map(lambda spec: run_one(out, spec), [s for s in plan.jobs() if s.role != "faulted"]))
    return out


def audit_faulted(
    base: Path, out: Path, plan: AuditPlan, faults: list[str], flags: str = ""
) -> tuple[ExperimentSummary, RunAnalysis]:
    """A copy of `base`'s failure-free runs, one faulted run with `faults` (and `flags` for the trainer),
    and the verdict."""
    return judged(*prepared(base, out, plan, faults, flags))


def prepared(
    base: Path, out: Path, plan: AuditPlan, faults: list[str], flags: str = ""
) -> tuple[Path, AuditPlan]:
    shutil.copytree(base, out)
    plan = replace(plan, faults=[parse_fault(f) for f in faults])
    write_plan(out, plan)
    spec = plan.job(FAULTED, "faulted", plan.faults)
    spec.env = {EXTRA_FLAGS: flags}
    run_one(out, spec)
    return out, plan


def judged(out: Path, plan: AuditPlan) -> tuple[ExperimentSummary, RunAnalysis]:
    summary = judge(out, plan, report=False)
    return summary, summary.groups[0].runs[FAULTED]


def audit_cases(
    base: Path, tmp: Path, plan: AuditPlan, cases: dict[str, tuple[list[str], str]]
) -> dict[str, tuple[ExperimentSummary, RunAnalysis]]:
    """Several faulted runs against one failure-free base (JOBS at a time), each judged: name ->
    (summary, the faulted run's analysis)."""
    with ThreadPoolExecutor(JOBS) as pool:
        made = {
            name: pool.submit(prepared, base, tmp / name, plan, faults, flags)
            for name, (faults, flags) in cases.items()
        }
        ready = {name: future.result() for name, future in made.items()}
    return {name: judged(*args) for name, args in ready.items()}


def restored_at(run: RunAnalysis) -> list[int]:
    """The steps the faulted run resumed from, as the audit inferred them from its logs."""
    return [w.resumed_at for w in run.comparison.windows] if run.comparison else []


def gap_texts(run: RunAnalysis) -> str:
    return " | ".join(g.text for g in run.verdict.gaps)
