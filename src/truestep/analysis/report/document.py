"""The whole report as one list of blocks: verdict, floor, the runs table, each run's sections,
checkpoint overhead, ablation and notes, with the figures placed where they belong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from truestep.analysis.report.blocks import Block, Heading, Para, Table, kv_table
from truestep.analysis.report.format import finite, fmt_dev, fmt_pct, fmt_rate, fmt_seconds, fmt_step
from truestep.analysis.report.sections import (
    ablation_blocks,
    checkpoint_row,
    fidelity_blocks,
    goodput_blocks,
    mttr_blocks,
)
from truestep.analysis.report.verdict import mean_mttr, run_verdict, verdict_paragraph


def ordered_runs(summary: dict[str, Any]) -> list[str]:
    names = list(summary.get("runs", {}))
    first = [n for n in ("reference", "floor", "faulted") if n in names]
    ablation = [c["run"] for c in summary.get("ablation") or [] if c.get("run") in names]
    return (
        first
        + [n for n in names if n.startswith("ablation-") and n not in ablation]
        + ablation
        + [n for n in names if n not in first and not n.startswith("ablation-")]
    )


def build_blocks(summary: dict[str, Any], images: dict[str, list[Any]], out: Path) -> list[Block]:
    """The whole report; `images` is make_plots' result (run name -> [Image], 'floor-band', 'ablation',
    'notes')."""
    runs = summary.get("runs", {})
    floor = summary.get("floor") or {}
    margin = summary.get("margin", 2.0)
    blocks: list[Block] = [
        Heading(1, "truestep experiment report"),
        Para(f"Experiment directory: `{out}`"),
        Heading(2, "Verdict"),
        Para(verdict_paragraph(summary)),
        Heading(2, "Floor"),
        Para(
            "The floor is the deviation between two failure-free runs with the same seed (reference and floor): "
            "the noise the platform itself makes. A step is correct while |Δloss| ≤ margin × floor and "
            "|Δgrad norm| ≤ margin × floor."
            + (
                " Here the floor is exactly zero: correct means bitwise equal."
                if floor.get("bitwise")
                else ""
            )
        ),
        kv_table(
            [
                ("max |Δloss| (floor)", fmt_dev(floor.get("max_dloss"))),
                ("max |Δgrad norm| (floor)", fmt_dev(floor.get("max_dgrad_norm"))),
                ("bitwise identical", "yes" if floor.get("bitwise") else "no"),
                ("margin", f"{margin:g}"),
                (
                    "threshold |Δloss|",
                    fmt_dev(margin * floor["max_dloss"]) if finite(floor.get("max_dloss")) else "—",
                ),
                (
                    "threshold |Δgrad norm|",
                    fmt_dev(margin * floor["max_dgrad_norm"]) if finite(floor.get("max_dgrad_norm")) else "—",
                ),
            ]
        ),
    ]
    blocks += images.get("floor-band", [])
    order = ordered_runs(summary)
    blocks += [Heading(2, "Runs")]
    blocks.append(
        Table(
            [
                "run",
                "faults",
                "resumes",
                "verdict",
                "first divergent",
                "first violation",
                "bitwise",
                "plain goodput",
                "correct goodput",
                "mean MTTR",
            ],
            [
                [
                    f"`{name}`",
                    str(len(runs[name].get("faults") or [])),
                    str(runs[name].get("restarts", 0)),
                    run_verdict(runs[name]),
                    fmt_step((runs[name].get("fidelity") or {}).get("first_divergent_step")),
                    fmt_step(runs[name].get("first_violation_step")),
                    fmt_pct((runs[name].get("fidelity") or {}).get("fraction_bitwise_equal")),
                    fmt_rate((runs[name].get("goodput") or {}).get("plain_tokens_per_s")),
                    fmt_rate((runs[name].get("goodput") or {}).get("correct_tokens_per_s")),
                    fmt_seconds(mean_mttr(runs[name])),
                ]
                for name in order
            ],
        )
    )
    for name in order:
        analysis = runs[name]
        blocks.append(Heading(3, f"Run `{name}`"))
        faults = analysis.get("faults") or []
        text = f"Directory `{analysis.get('path', '')}`. "
        text += f"Faults: {', '.join(f'`{f}`' for f in faults)}. " if faults else "No faults injected. "
        text += f"Resumes: {analysis.get('restarts', 0)}. "
        if name == "reference":
            text += "This is the reference every other run is compared with."
        elif name == "floor":
            text += "Same seed, no faults: its deviation from the reference is the floor."
        else:
            text += f"Verdict: **{run_verdict(analysis)}**."
        blocks.append(Para(text))
        if name != "reference":
            blocks += fidelity_blocks(analysis, margin, floor)
        blocks += goodput_blocks(analysis)
        blocks += mttr_blocks(analysis)
        blocks += images.get(name, [])
    blocks += [
        Heading(2, "Checkpoint overhead"),
        Para(
            "Blocking time of each save (the training loop waits for it) and its share of step time + blocking time."
        ),
        Table(
            ["run", "saves", "mean blocking", "share of training time"],
            [checkpoint_row(n, runs[n]) for n in order],
        ),
    ]
    cells = summary.get("ablation") or []
    if cells:
        blocks += ablation_blocks(cells)
        blocks += images.get("ablation", [])
    notes = images.get("notes")
    if notes:
        blocks += [Heading(2, "Notes"), Para("; ".join(str(n) for n in notes))]
    return blocks
