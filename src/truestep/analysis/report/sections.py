"""The per-run sections of the report (fidelity, goodput and badput, time to recovery, checkpoint
overhead) and the ablation section, each as a list of blocks."""

from __future__ import annotations

from typing import Any

from truestep.analysis.report.blocks import Block, Heading, Para, Table, kv_table
from truestep.analysis.report.format import (
    BADPUT_ORDER,
    PHASES,
    fmt_dev,
    fmt_pct,
    fmt_rate,
    fmt_seconds,
    fmt_step,
)
from truestep.analysis.report.verdict import digest_text, run_verdict


def fidelity_blocks(analysis: dict[str, Any], margin: float, floor: dict[str, Any]) -> list[Block]:
    fid = analysis.get("fidelity")
    if fid is None:
        return []
    missing = fid.get("missing_steps") or []
    compared = fid.get("steps_compared", 0)
    rows = [
        ("verdict", run_verdict(analysis)),
        (
            "steps compared",
            f"{compared} of {compared + len(missing)}" + (f" ({len(missing)} missing)" if missing else ""),
        ),
        ("first divergent step (bitwise)", fmt_step(fid.get("first_divergent_step"))),
        (f"first violation ({margin:g} × floor)", fmt_step(analysis.get("first_violation_step"))),
        ("fraction bitwise equal", fmt_pct(fid.get("fraction_bitwise_equal"))),
        ("max |Δloss|", fmt_dev(fid.get("max_dloss"))),
        ("mean |Δloss|", fmt_dev(fid.get("mean_dloss"))),
        ("max |Δgrad norm|", fmt_dev(fid.get("max_dgrad_norm"))),
        ("parameter digests", digest_text(fid)),
        ("layout changed on resume", "yes" if fid.get("layout_changed") else "no"),
        (
            "floor",
            f"{analysis.get('floor_source', 'measured')}, bitwise"
            if floor.get("bitwise")
            else analysis.get("floor_source", "measured"),
        ),
    ]
    blocks: list[Block] = [Heading(4, "Fidelity"), kv_table(rows)]
    windows = fid.get("windows") or []
    if windows:
        blocks.append(Para("Per resume window (the steps computed by the attempt that resumed):"))
        blocks.append(
            Table(
                [
                    "resumed at step",
                    "steps",
                    "max |Δloss|",
                    "mean |Δloss|",
                    "max |Δgrad norm|",
                    "layout changed",
                ],
                [
                    [
                        str(w.get("resumed_at")),
                        str(w.get("steps")),
                        fmt_dev(w.get("max_dloss")),
                        fmt_dev(w.get("mean_dloss")),
                        fmt_dev(w.get("max_dgrad_norm")),
                        "yes" if w.get("layout_changed") else "no",
                    ]
                    for w in windows
                ],
            )
        )
    return blocks


def goodput_blocks(analysis: dict[str, Any]) -> list[Block]:
    gp = analysis.get("goodput")
    if not gp:
        return []
    plain, correct = gp.get("plain_tokens_per_s") or 0.0, gp.get("correct_tokens_per_s") or 0.0
    rows = [
        ("wall clock (all attempts)", fmt_seconds(gp.get("wall_s"))),
        ("steps (correct / final trajectory)", f"{gp.get('correct_steps')} / {gp.get('steps')}"),
        ("tokens per step", f"{gp.get('tokens_per_step', 0):,}"),
        ("plain goodput", fmt_rate(plain)),
        ("correct goodput", fmt_rate(correct)),
        ("correct / plain", fmt_pct(correct / plain) if plain else "—"),
        ("useful training time", fmt_seconds(gp.get("useful_s"))),
    ]
    wall = gp.get("wall_s") or 0.0
    buckets = gp.get("badput_s") or {}
    names = [k for k in BADPUT_ORDER if k in buckets] + [k for k in buckets if k not in BADPUT_ORDER]
    bad_rows = [
        [k.replace("_", " "), fmt_seconds(buckets[k]), fmt_pct(buckets[k] / wall) if wall else "—"]
        for k in names
    ]
    bad_rows.append(
        [
            "useful (kept, correct steps)",
            fmt_seconds(gp.get("useful_s")),
            fmt_pct((gp.get("useful_s") or 0) / wall) if wall else "—",
        ]
    )
    total = sum(buckets.values()) + (gp.get("useful_s") or 0.0)
    bad_rows.append(["**total**", fmt_seconds(total), fmt_pct(total / wall) if wall else "—"])
    return [
        Heading(4, "Goodput"),
        kv_table(rows),
        Heading(4, "Badput"),
        Table(["bucket", "seconds", "% of wall"], bad_rows),
    ]


def mttr_blocks(analysis: dict[str, Any]) -> list[Block]:
    incidents = analysis.get("mttr") or []
    if not incidents:
        return []
    rows = []
    for n, inc in enumerate(incidents, 1):
        phases = inc.get("phases_s") or {}
        rows.append(
            [str(n), str(inc.get("kind")), str(inc.get("pre_fault_step"))]
            + [fmt_seconds(phases.get(p)) for p in PHASES]
            + [fmt_seconds(inc.get("mttr_s")), fmt_seconds(inc.get("regain_s"))]
        )
    return [
        Heading(4, "Time to recovery"),
        Para(
            "Per injected fault: fault → detected → all ranks down → relaunched → restored → first new step "
            "(MTTR), and fault → the pre-fault step reached again (regain). — = the run never got there."
        ),
        Table(
            [
                "#",
                "kind",
                "pre-fault step",
                "detect",
                "teardown",
                "relaunch",
                "start + restore",
                "first step",
                "MTTR",
                "regain",
            ],
            rows,
        ),
    ]


def checkpoint_row(name: str, analysis: dict[str, Any]) -> list[str]:
    ck = analysis.get("checkpoint") or {}
    return [
        f"`{name}`",
        str(ck.get("saves", 0)),
        fmt_seconds(ck.get("mean_blocking_s")),
        fmt_pct(ck.get("amortized_blocking_fraction")),
    ]


def ablation_blocks(cells: list[dict[str, Any]]) -> list[Block]:
    rows = list(dict.fromkeys(c["row"] for c in cells))
    modes = list(dict.fromkeys(c["mode"] for c in cells))
    by = {(c["row"], c["mode"]): c for c in cells}

    def cell(c: dict[str, Any] | None) -> str:
        if c is None:
            return "not run"
        if c.get("flagged"):
            return f"**FLAGGED** (diverged at {fmt_step(c.get('first_divergent_step'))}, violation at {fmt_step(c.get('first_violation_step'))})"
        div = c.get("first_divergent_step")
        return "ok (bitwise)" if div is None else f"ok (within floor; first difference at {div})"

    return [
        Heading(2, "Ablation"),
        Para(
            "Each row switches one recovery mechanism off; each mode recovers from a graceful preemption or a "
            "hard failure. A cell is flagged when its run leaves the floor band. A correct instrument flags "
            "the rows whose mechanism matters and never the all-on row."
        ),
        Table(["row", *modes], [[f"`{r}`", *[cell(by.get((r, m))) for m in modes]] for r in rows]),
        Table(
            [
                "row",
                "mode",
                "flagged",
                "first divergent",
                "first violation",
                "plain goodput",
                "correct goodput",
            ],
            [
                [
                    f"`{c['row']}`",
                    c["mode"],
                    "**yes**" if c.get("flagged") else "no",
                    fmt_step(c.get("first_divergent_step")),
                    fmt_step(c.get("first_violation_step")),
                    fmt_rate(c.get("plain_tokens_per_s")),
                    fmt_rate(c.get("correct_tokens_per_s")),
                ]
                for c in cells
            ],
        ),
    ]
