"""The whole report as one list of blocks: verdict, then per group the floor, the runs table, each run's
sections and the ablation matrix, then checkpoint overhead and notes, with the figures placed where they
belong. The first group is reported in full; further groups (the demo's emulated nonzero floor) get a
compact section: floor, envelope figure, runs table and ablation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from truestep.analysis.report.blocks import Block, Heading, Image, Para, Table
from truestep.analysis.report.format import fmt_pct, fmt_rate, fmt_seconds, fmt_step
from truestep.analysis.report.headline import headline_blocks
from truestep.analysis.report.opening import verdict_paragraph
from truestep.analysis.report.recovery import recovery_blocks
from truestep.analysis.report.sections import (
    ablation_blocks,
    cannot_see_blocks,
    checkpoint_row,
    fidelity_blocks,
    floor_blocks,
    goodput_blocks,
    mttr_blocks,
)
from truestep.analysis.report.training import training_blocks
from truestep.analysis.summary import ExperimentSummary, GroupSummary, RunAnalysis

FLOOR_TEXT = (
    "The floor is how far failure-free runs with the same seed (the repeats) land from the reference: the "
    "noise the platform itself makes. Every observable (the change of every logged value per step, parameter "
    "digests, distances of parameters and optimizer moments at checkpoint steps) has its own envelope, the "
    "second-largest (from 3 distinct repeats on; the largest below) of the repeats' running maxima up to "
    "that step, and a threshold calibrated by leave-one-out over the distinct repeats (docs/measures.md)."
)


@dataclass
class Figures:
    """make_plots' result: the images placed in the report, and notes on plots that failed."""

    runs: dict[str, list[Image]] = field(default_factory=dict)
    floors: dict[str, list[Image]] = field(default_factory=dict)
    """Group name -> the floor figures (envelope, state distances)."""
    ablation: dict[str, list[Image]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def ordered_runs(group: GroupSummary) -> list[RunAnalysis]:
    rank = {"reference": 0, "floor": 1, "faulted": 2, "run": 3, "ablation": 4}
    cells = {c.run: i for i, c in enumerate(group.cells)}
    return sorted(group.runs.values(), key=lambda r: (rank.get(r.role, 3), cells.get(r.name, 0)))


def runs_table(group: GroupSummary) -> Table:
    return Table(
        ["run", "faults", "resumes", "verdict", "self-check", "first divergent", "first violation", "bitwise"]
        + ["plain goodput", "correct goodput", "mean MTTR"],
        [
            [
                f"`{r.name}`",
                str(len(r.faults)),
                str(r.resumes),
                r.verdict.label if r.role != "reference" else "reference",
                r.self_check,
                fmt_step(r.comparison.first_divergent_step if r.comparison else None),
                fmt_step(r.verdict.first_violation_step),
                fmt_pct(r.comparison.fraction_bitwise_equal if r.comparison else None),
                fmt_rate(r.goodput.plain_tokens_per_s),
                fmt_rate(r.goodput.correct_tokens_per_s),
                fmt_seconds(r.mean_mttr_s),
            ]
            for r in ordered_runs(group)
        ],
    )


FULL_ROLES = ("reference", "faulted", "run")
"""Runs reported in full. A floor repeat is a failure-free rerun (the runs table and the floor section say
what it showed); an ablation cell's point is its verdict and recovery path (the matrix and the runs table
give its goodput): their sections leave out what would repeat the others' (the demo's report was 1,248
lines)."""


def run_section(
    run: RunAnalysis, group: GroupSummary, figures: Figures, explain_mttr: bool = True
) -> list[Block]:
    blocks: list[Block] = [Heading(3, f"Run `{run.name}`")]
    text = f"Directory `{run.path}`. "
    text += f"Faults: {', '.join(f'`{f}`' for f in run.faults)}. " if run.faults else "No faults injected. "
    others = [i for i in run.incidents if i.origin != "injected"]
    if others:
        kinds = ", ".join(sorted({f"{i.kind} ({i.origin})" for i in others}))
        text += f"Recovered from {len(others)} incident(s) nobody injected: {kinds}. "
    text += f"Resumes: {run.resumes}. "
    if run.role == "reference":
        text += "This is the reference every other run is compared with."
    elif run.role == "floor":
        text += f"Same seed, no faults: one of the repeats the floor is made of ({run.verdict.label})."
    else:
        text += f"Verdict: **{run.verdict.label}**."
    if run.role not in FULL_ROLES:
        text += (
            " Its goodput and badput are in the runs table and summary.json."
            if run.role != "floor"
            else " Its numbers are in the runs table and summary.json."
        )
    blocks.append(Para(text))
    full = run.role in FULL_ROLES
    if full or not run.verdict.preserving:  # a verdict the paragraph above does not say all of
        blocks += fidelity_blocks(run, group.floor)
    if run.role != "floor":
        blocks += recovery_blocks(run)
    if full:
        blocks += goodput_blocks(run)
    blocks += mttr_blocks(run, explain_mttr)
    blocks += training_blocks(run)
    return blocks + figures.runs.get(run.name, [])


def group_blocks(group: GroupSummary, figures: Figures, full: bool) -> list[Block]:
    title = "Floor" if not group.name else f"{group.name.capitalize()}: {group.note}"
    blocks: list[Block] = [Heading(2, title)]
    if group.name:
        blocks.append(Para(f"Verdict of this group: **{group.verdict.head}**."))
    blocks += [Para(FLOOR_TEXT), *floor_blocks(group.floor), *figures.floors.get(group.name, [])]
    blocks += [Heading(3 if group.name else 2, "Runs"), runs_table(group)]
    if full:
        explained = False
        for run in ordered_runs(group):
            blocks += run_section(run, group, figures, explain_mttr=not explained)
            explained = explained or bool(run.incidents)
    if group.cells:
        blocks += [Heading(3 if group.name else 2, "Ablation"), *ablation_blocks(group)]
        blocks += figures.ablation.get(group.name, [])
    return blocks


def build_blocks(summary: ExperimentSummary, figures: Figures, out: Path) -> list[Block]:
    main, *others = summary.groups
    blocks: list[Block] = [
        Heading(1, "truestep experiment report"),
        Para(f"Experiment directory: `{out}`"),
        *headline_blocks(summary),
        Heading(2, "Verdict"),
        Para(verdict_paragraph(summary)),
    ]
    blocks += group_blocks(main, figures, full=True)
    for group in others:
        blocks += group_blocks(group, figures, full=False)
    blocks += cannot_see_blocks(summary)
    blocks += [
        Heading(2, "Checkpoint overhead"),
        Para(
            "Blocking time of each save (the training loop waits for it) and its share of step time + blocking time."
        ),
        Table(
            ["run", "saves", "mean blocking", "share of training time"],
            [checkpoint_row(r) for g in summary.groups for r in ordered_runs(g)],
        ),
    ]
    if figures.notes:
        blocks += [Heading(2, "Notes"), Para("; ".join(figures.notes))]
    return blocks
