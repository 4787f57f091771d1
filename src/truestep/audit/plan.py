"""The runs of one audit and their verdict: the failure-free reference, K same-seed repeats (the floor)
and the faulted run, each written as a truestep run directory; then the analysis room's verdict, evidence
ledger, goodput, MTTR and report, exactly as for `truestep experiment`.

Directory layout (the same as an experiment's, so `truestep report OUT` and `truestep fidelity` read it):
  OUT/experiment.json     every run with its role (and OUT/audit.json: what was audited)
  OUT/runs/<run>/         metrics.jsonl, events.jsonl written by the audit; job/ is the command's {run_dir}
  OUT/logs/<run>.log      the command's console output, every attempt
  OUT/summary.json, report.md, report.html, plots/
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from truestep.analysis.fidelity import DEFAULT_MARGIN
from truestep.analysis.runlog import EVIDENCE_GAP, RunLog
from truestep.analysis.summary import ExperimentSummary, analyze_group, summarize_groups, to_json
from truestep.audit.job import JobRecord, JobSpec, run_job, say
from truestep.audit.rundir import write
from truestep.audit.spec import FaultSpec, LogSpec
from truestep.core.errors import RefusedError
from truestep.core.fsio import atomic_write, make_dir
from truestep.core.names import METRICS_FILE

DEFAULT_REPEATS = 2
"""Same-seed repeats for the floor: the fewest that calibrate a nonzero floor (each is a whole run of
the user's job; `truestep experiment` uses 3, which lowers the false-positive rate: docs/measures.md)."""
REFERENCE, FAULTED = "reference", "faulted"


class AuditError(RefusedError):
    """The audit cannot judge: a failure-free run failed, or the output directory already holds runs."""


@dataclass
class AuditPlan:
    command: list[str]
    logs: LogSpec
    faults: list[FaultSpec]
    repeats: int = DEFAULT_REPEATS
    weights: str | None = None
    max_restarts: int = 4
    grace_s: float = 30.0
    timeout_s: float = 3600.0
    tokens_per_step: int = 1
    margin: float = DEFAULT_MARGIN
    env: dict[str, str] = field(default_factory=dict)

    def job(self, name: str, role: str, faults: list[FaultSpec] | None = None) -> JobSpec:
        return JobSpec(
            name,
            role,
            self.command,
            self.logs,
            list(faults or []),
            self.weights,
            self.max_restarts,
            self.grace_s,
            self.timeout_s,
            dict(self.env) or None,
        )

    def jobs(self) -> list[JobSpec]:
        runs = [self.job(REFERENCE, "reference")]
        runs += [self.job(f"floor-{k}", "floor") for k in range(1, self.repeats + 1)]
        return runs + [self.job(FAULTED, "faulted", self.faults)]


def write_plan(out: Path, plan: AuditPlan) -> None:
    make_dir(out)
    jobs = [
        {"name": j.name, "role": j.role, "group": "", "faults": [f.text for f in j.faults]}
        for j in plan.jobs()
    ]
    atomic_write(out / "experiment.json", json.dumps({"jobs": jobs, "groups": {}}, indent=1).encode())
    audit = {
        "command": plan.command,
        "logs": plan.logs.text,
        "tags": plan.logs.tags,
        "faults": [f.text for f in plan.faults],
        "repeats": plan.repeats,
        "weights": plan.weights,
        "tokens_per_step": plan.tokens_per_step,
    }
    atomic_write(out / "audit.json", json.dumps(audit, indent=1).encode())


def run_one(out: Path, spec: JobSpec, tokens_per_step: int = 1) -> JobRecord:
    """Run one job into OUT/runs/<name> and write its run directory. A reference or floor run must end
    cleanly with every step logged: anything else is refused (AuditError, exit 3)."""
    run_dir = out / "runs" / spec.name
    if (run_dir / METRICS_FILE).exists():
        raise AuditError(f"{run_dir} already holds a run; use a fresh --out directory")
    make_dir(out / "logs")
    make_dir(run_dir)
    started = time.time()
    job = run_job(spec, run_dir, out / "logs" / f"{spec.name}.log")
    metrics, events = write(job, run_dir, tokens_per_step)
    steps = len({m["step"] for m in metrics})
    say(
        f"{spec.name}: {'finished' if job.finished else 'did NOT finish'} in {time.time() - started:.1f} s, "
        f"{len(job.attempts)} attempt(s), {steps} step(s) logged"
    )
    gaps = [
        f"{e['what']} ({e['detail']})" if e.get("detail") else e["what"]
        for e in events
        if e["event"] == EVIDENCE_GAP
    ]
    restarted = len(job.attempts) > 1  # a failure-free run is one attempt (analysis/floor.py says so too)
    if spec.role in ("reference", "floor") and (gaps or not steps or not job.finished or restarted):
        why = "; ".join(gaps) or (
            "no step logged: check --logs"
            if not steps
            else f"it restarted ({len(job.attempts)} attempts)"
            if restarted
            else "it did not finish"
        )
        raise AuditError(
            f"the failure-free {spec.name} run cannot serve: {why} (see {out / 'logs' / (spec.name + '.log')})"
        )
    return job


def judge(out: Path, plan: AuditPlan, report: bool = True) -> ExperimentSummary:
    """The analysis room's verdict on the audit's runs; writes summary.json and (unless `report` is
    false: tests that need the verdict only) the report."""
    names = [j.name for j in plan.jobs()]
    logs = {name: RunLog.load(out / "runs" / name) for name in names}
    floors = {n: logs[n] for n in names if n.startswith("floor-")}
    group = analyze_group(
        REFERENCE, logs[REFERENCE], floors, {FAULTED: ("faulted", logs[FAULTED])}, [], plan.margin
    )
    summary = summarize_groups([group], plan.margin)
    atomic_write(out / "summary.json", to_json(summary).encode())
    if report:
        from truestep.analysis.report import write_report

        write_report(out, summary)
    return summary


def headline(summary: ExperimentSummary, out: Path) -> list[str]:
    group = summary.groups[0]
    run = group.runs[FAULTED]
    lines = [f"{summary.verdict.head}: `{FAULTED}` {run.verdict.label}", f"floor: {group.floor.label}"]
    lines += [f"note: {n}" for n in group.floor.notes + group.floor.precision]
    lines += [f"MISSING: {gap.text}" for gap in run.verdict.gaps]
    if run.mean_mttr_s is not None:
        lines.append(f"mean time to recovery: {run.mean_mttr_s:.2f} s over {len(run.incidents)} fault(s)")
    return lines + [f"report: {out / 'report.md'}"]


def run_audit(out: Path, plan: AuditPlan, report: bool = True) -> int:
    """Every run, then the verdict: exit 0 preserving, 1 not, 8 incomplete."""
    if (out / "runs").exists() and any((out / "runs").iterdir()):
        raise AuditError(f"{out} already holds runs; use a fresh --out directory")
    write_plan(out, plan)
    jobs = plan.jobs()
    for index, spec in enumerate(jobs, 1):
        faults = ", ".join(f.text for f in spec.faults) or "none"
        say(f"[{index}/{len(jobs)}] {spec.name} (faults: {faults})")
        run_one(out, spec, plan.tokens_per_step)
    summary = judge(out, plan, report)
    for line in headline(summary, out)[: None if report else -1]:
        say(line)
    return summary.verdict.exit_code


def with_env(plan: AuditPlan, env: dict[str, str]) -> AuditPlan:
    return replace(plan, env={**plan.env, **env})
