"""`truestep plan`: the goodput a job will get at a target size, and what buys it (docs/plan.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from truestep.analysis.report.format import fmt_pct, fmt_seconds


def plan_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="truestep plan",
        description="Seeded Monte Carlo simulation of a long job: plain and correct goodput, badput, the "
        "checkpoint interval, each mechanism switched off, sensitivity, goodput vs GPU count. Inputs: "
        "--section.key=value (docs/plan.md lists them).",
    )
    p.add_argument(
        "--from", dest="source", help="a run or experiment directory to measure the phase costs from"
    )
    p.add_argument("--config", help="a TOML file of plan inputs ([job], [failures], [costs], ...)")
    p.add_argument(
        "--out", help="where plan.md, plan.html, plan.json and plots/ go (default: FROM/plan or runs/plan)"
    )
    p.add_argument(
        "--sweep-replicas", type=int, default=200, help="replicas per setting of the sweeps and tables"
    )
    a, overrides = p.parse_known_args(argv)
    from truestep.plan.inputs import MAX_REPLICAS

    if not 10 <= a.sweep_replicas <= MAX_REPLICAS:
        p.error(f"--sweep-replicas must be within [10, {MAX_REPLICAS}]")
    strays = [o for o in overrides if not o.startswith("--") or "=" not in o]
    if strays:
        p.error(f"unrecognized arguments: {' '.join(strays)} (inputs are --section.key=value)")
    from truestep.plan.build import assemble
    from truestep.plan.report import summary_text, write_plan
    from truestep.plan.study import make_plan

    source = Path(a.source) if a.source else None
    assembled = assemble(source, Path(a.config) if a.config else None, overrides)
    result = make_plan(
        assembled, a.sweep_replicas, lambda what: print(f"  simulating: {what}", file=sys.stderr, flush=True)
    )
    out = Path(a.out) if a.out else (source / "plan" if source else Path("runs/plan"))
    md, html = write_plan(out, assembled, result)
    iv = result.intervals
    print(summary_text(assembled, result).replace("**", ""))
    print(
        f"checkpoint interval: simulated optimum {fmt_seconds(iv.optimum_s)}, Young {fmt_seconds(iv.young_s)}, "
        f"Daly {fmt_seconds(iv.daly_s)}"
    )
    for name, (plain, correct, _) in result.mechanisms.items():
        print(f"  {name:30s} plain {fmt_pct(plain.mean):>8s}   correct {fmt_pct(correct.mean):>8s}")
    for row in result.snapshots.rows if result.snapshots else []:
        k = f"every {row.k} step(s)" if row.k else "off"
        print(
            f"  peer snapshots {k:14s} correct {fmt_pct(row.correct.mean):>8s}   "
            f"{row.steps_lost:,.2f} steps lost per failure, {fmt_pct(row.from_memory)} from memory"
        )
    for note in assembled.notes:
        print(f"note: {note}")
    print(f"plan: {md}\n      {html}")
    return 0
