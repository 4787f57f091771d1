"""`truestep experiment | fidelity | goodput | report | demo`: the measuring instrument's commands.

Every verdict comes from analysis/verdict.py and every exit code from it: 0 when the run (or the
experiment) is what the report calls correct, 1 when it was shown not to be, 8 when the evidence is
incomplete (or the floor insufficient); refused input exits 3 with one line (a run of another
experiment too, unless --compare-anyway).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from truestep.analysis.fidelity import DEFAULT_MARGIN
from truestep.analysis.floor import measure_floor
from truestep.analysis.runlog import RunLog
from truestep.analysis.summary import ExperimentSummary, analyze_run, to_json
from truestep.config.load import load_config
from truestep.core.errors import UsageError
from truestep.experiment.plan import DEFAULT_REPEATS, plan_jobs
from truestep.experiment.runner import JobSpec, run_plan
from truestep.experiment.summary import summarize
from truestep.faults.spec import campaign, parse_faults

DEMO_FAULTS = ["kill:rank=1:step=12", "term:step=22:restart=1"]
DEMO_EMULATION = 1e-2
"""The demo's emulated GPU noise (relative gradient noise): strong enough for a visible floor (~1e-4)."""
DEMO_EMULATED_REPEATS = 3


def _floor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--floor",
        action="append",
        default=[],
        help="a failure-free same-seed repeat of REF (repeatable; two or more calibrate the threshold)",
    )
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help="threshold = margin x leave-one-out")
    p.add_argument(
        "--skip-state",
        action="store_true",
        help="do not read checkpoints (state distances): the verdict is then incomplete",
    )
    p.add_argument(
        "--cross-layout-floor",
        action="store_true",
        help="accept floor runs of another layout than the reference (the floor is labelled cross-layout)",
    )
    p.add_argument(
        "--compare-anyway",
        action="store_true",
        help="compare a run whose config differs from the reference's (refused otherwise; the verdict is "
        "then incomplete)",
    )
    p.add_argument(
        "--allow-provenance-mismatch",
        action="store_true",
        help="compare runs whose recorded code, data, init source or torch differ from the reference's "
        "(refused otherwise; every verdict is then labelled PROVENANCE DIFFERS)",
    )
    p.add_argument("--json", action="store_true")


def _judge_one(a: argparse.Namespace) -> int:
    from truestep.analysis.report import render_run_text

    if a.floor and not a.reference:
        raise UsageError("--floor needs --reference")
    run = RunLog.load(a.run)
    ref = RunLog.load(a.reference) if a.reference else None
    floor = (
        measure_floor(
            ref,
            [RunLog.load(f) for f in a.floor],
            a.margin,
            not a.skip_state,
            a.cross_layout_floor,
            a.allow_provenance_mismatch,
        )
        if ref
        else None
    )
    result = analyze_run(
        a.run,
        run,
        ref,
        floor,
        read_state=not a.skip_state,
        compare_anyway=a.compare_anyway,
        any_provenance=a.allow_provenance_mismatch,
    )
    print(to_json(result) if a.json else render_run_text(result))
    return result.verdict.exit_code


def fidelity_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="truestep fidelity", description="Trajectory fidelity of RUN vs REF.")
    p.add_argument("run")
    p.add_argument("--reference", required=True, help="failure-free same-seed run directory")
    _floor_args(p)
    return _judge_one(p.parse_args(argv))


def goodput_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="truestep goodput", description="Goodput, badput and MTTR of RUN.")
    p.add_argument("run")
    p.add_argument("--reference", help="if given, correct goodput counts only trajectory-preserving work")
    _floor_args(p)
    return _judge_one(p.parse_args(argv))


def _report(out: Path, summary: ExperimentSummary) -> None:
    from truestep.analysis.report import write_report

    md, html = write_report(out, summary)
    print(
        f"\n{summary.verdict.head}"
        + (": " + "; ".join(summary.verdict.failures) if summary.verdict.failures else "")
    )
    print(f"report: {md}\n        {html}")


def report_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="truestep report", description="report.md + report.html for DIR.")
    p.add_argument("dir", help="an experiment directory (with experiment.json)")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    p.add_argument(
        "--skip-state",
        action="store_true",
        help="do not read checkpoints (state distances): verdicts are then incomplete where runs kept any",
    )
    a = p.parse_args(argv)
    summary = summarize(Path(a.dir), a.margin, not a.skip_state)
    _report(Path(a.dir), summary)
    return summary.verdict.exit_code


def _run_and_report(
    out: Path, jobs: list[JobSpec], margin: float, notes: dict[str, str] | None = None
) -> int:
    run_plan(out, jobs, notes=notes)
    started = time.time()
    print(f"report: reading {len(jobs)} runs (metrics, events, checkpoint state) ...", flush=True)
    summary = summarize(out, margin)
    _report(out, summary)
    print(f"report phase took {time.time() - started:.1f}s", flush=True)
    return summary.verdict.exit_code


def experiment_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="truestep experiment",
        description="Reference, K same-seed repeats (the floor), faulted run(s) and optionally the ablation "
        "matrix, then the report. Exit 0 when the report says PASS.",
    )
    p.add_argument("config", nargs="?", default="demo")
    p.add_argument("--out", default="runs/experiment")
    p.add_argument("--nproc", type=int, default=2, help="ranks per node")
    p.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="supervisors ('nodes') per job on this machine; with kill:node=K the report covers a node "
        "loss end to end (docs/slurm.md)",
    )
    p.add_argument("--fault", action="append", default=[], help="fault spec (repeatable); see docs/faults.md")
    p.add_argument("--campaign", type=int, default=0, help="add N random process-level faults")
    p.add_argument("--seed", type=int, default=0, help="campaign seed")
    p.add_argument("--ablation", action="store_true", help="also run the mechanism on/off matrix")
    p.add_argument(
        "--repeats", type=int, default=DEFAULT_REPEATS, help="same-seed repeats for the floor (K >= 1)"
    )
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    a, overrides = p.parse_known_args(argv)
    if a.nproc < 1 or a.nnodes < 1:
        p.error("--nproc and --nnodes must be >= 1")
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    cfg = load_config(a.config, overrides)
    faults = list(a.fault)
    if a.campaign:
        world = a.nproc * a.nnodes
        faults += campaign(a.campaign, a.seed, cfg.train.max_steps, world, cfg.checkpoint.interval or 5)
    parse_faults(";".join(faults))  # reject bad specs before any run starts
    if not faults and not a.ablation:
        p.error("nothing to measure: give --fault, --campaign N or --ablation")
    jobs = plan_jobs(
        a.config,
        overrides,
        a.nproc,
        faults,
        a.ablation,
        interval=cfg.checkpoint.interval or 5,
        repeats=a.repeats,
        nnodes=a.nnodes,
    )
    return _run_and_report(Path(a.out), jobs, a.margin)


def demo_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="truestep demo",
        description="The whole story on the built-in default: 2 processes, two faults of different classes, "
        "the same-seed floor, the ablation matrix, then the same where the floor is not zero (emulated GPU "
        "noise), and the report. Exit 0 when the report says PASS.",
    )
    p.add_argument("--out", default="runs/demo")
    a, overrides = p.parse_known_args(argv)
    interval = load_config("demo", overrides).checkpoint.interval or 5
    jobs = plan_jobs("demo", overrides, 2, DEMO_FAULTS, True, interval=interval, repeats=1)
    noisy = [*overrides, f"--train.emulate_nondeterminism={DEMO_EMULATION}"]
    jobs += plan_jobs(
        "demo",
        noisy,
        1,
        [],
        True,
        ablation_rows=["all-on", "optimizer-restore-off"],
        ablation_modes=["hard"],
        interval=interval,
        repeats=DEMO_EMULATED_REPEATS,
        group="emulated",
    )
    notes = {"emulated": f"emulated GPU nondeterminism, train.emulate_nondeterminism={DEMO_EMULATION:g}"}
    return _run_and_report(Path(a.out), jobs, DEFAULT_MARGIN, notes)
