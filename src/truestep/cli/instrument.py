"""`truestep experiment | fidelity | goodput | report | demo`: the measuring instrument's commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from truestep.analysis.fidelity import DEFAULT_MARGIN, floor
from truestep.analysis.runlog import RunLog
from truestep.analysis.summary import analyze
from truestep.config.load import load_config
from truestep.experiment.plan import plan_jobs
from truestep.experiment.runner import run_plan
from truestep.experiment.summary import summarize
from truestep.faults.spec import campaign, parse_faults

DEMO_FAULTS = ["kill:rank=1:step=12", "term:step=22:restart=1"]


def _print_run(name: str, result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=1, default=str))
        return
    from truestep.analysis.report import render_run_text

    print(render_run_text(name, result))


def fidelity_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="truestep fidelity", description="Trajectory fidelity of RUN vs REF.")
    p.add_argument("run")
    p.add_argument("--reference", required=True, help="failure-free same-seed run directory")
    p.add_argument("--floor", help="a second failure-free run: measures the same-seed floor")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    ref = RunLog.load(a.reference)
    base = floor(RunLog.load(a.floor), ref) if a.floor else None
    result = analyze(RunLog.load(a.run), ref, base, a.margin)
    _print_run(a.run, result, a.json)
    return 0 if result["preserving"] else 1


def goodput_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="truestep goodput", description="Goodput, badput and MTTR of RUN.")
    p.add_argument("run")
    p.add_argument("--reference", help="if given, correct goodput counts only trajectory-preserving work")
    p.add_argument("--floor")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    ref = RunLog.load(a.reference) if a.reference else None
    base = floor(RunLog.load(a.floor), ref) if a.floor and ref else None
    _print_run(a.run, analyze(RunLog.load(a.run), ref, base, a.margin), a.json)
    return 0


def report_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="truestep report", description="report.md + report.html for DIR.")
    p.add_argument("dir", help="an experiment directory (with experiment.json)")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    a = p.parse_args(argv)
    from truestep.analysis.report import write_report

    md, html = write_report(Path(a.dir), summarize(Path(a.dir), a.margin))
    print(f"wrote {md}\nwrote {html}")
    return 0


def _experiment(
    config: str,
    overrides: list[str],
    out: Path,
    nproc: int,
    faults: list[str],
    ablation: bool,
    margin: float,
    nnodes: int = 1,
) -> dict:
    cfg = load_config(config, overrides)
    interval = cfg.checkpoint.interval or 5
    jobs = plan_jobs(config, overrides, nproc, faults, ablation, interval=interval, nnodes=nnodes)
    run_plan(out, jobs)
    summary = summarize(out, margin)
    from truestep.analysis.report import write_report

    md, html = write_report(out, summary)
    print(f"\nreport: {md}\n        {html}")
    return summary


def experiment_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="truestep experiment",
        description="Reference, same-seed floor, faulted run(s) and optionally the ablation matrix, then the report.",
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
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    a, overrides = p.parse_known_args(argv)
    if a.nproc < 1 or a.nnodes < 1:
        p.error("--nproc and --nnodes must be >= 1")
    faults = list(a.fault)
    if a.campaign:
        cfg = load_config(a.config, overrides)
        world = a.nproc * a.nnodes
        faults += campaign(a.campaign, a.seed, cfg.train.max_steps, world, cfg.checkpoint.interval or 5)
    parse_faults(";".join(faults))  # reject bad specs before any run starts
    if not faults and not a.ablation:
        p.error("nothing to measure: give --fault, --campaign N or --ablation")
    summary = _experiment(a.config, overrides, Path(a.out), a.nproc, faults, a.ablation, a.margin, a.nnodes)
    faulted = summary["runs"].get("faulted")
    return 0 if faulted is None or faulted["preserving"] else 1


def demo_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="truestep demo",
        description="The whole story on the built-in default: 2 processes, two faults of different "
        "classes, the same-seed floor, the ablation matrix and the report.",
    )
    p.add_argument("--out", default="runs/demo")
    a, overrides = p.parse_known_args(argv)
    summary = _experiment("demo", overrides, Path(a.out), 2, DEMO_FAULTS, True, DEFAULT_MARGIN)
    faulted = summary["runs"]["faulted"]
    flagged = {(c["row"], c["mode"]): c["flagged"] for c in summary["ablation"]}
    print(f"same-seed floor: {json.dumps(summary['floor'])}")
    print(f"faulted run trajectory-preserving: {faulted['preserving']}")
    print(f"ablation flagged: {flagged}")
    return (
        0 if faulted["preserving"] and not any(v for (row, _), v in flagged.items() if row == "all-on") else 1
    )
