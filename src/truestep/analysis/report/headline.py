"""The report's headline block, read at a glance before any detail: the verdict, the rule it applied in
one sentence, a table of the scenarios (verdict, first divergence, correct goodput as a share of the
failure-free run's, MTTR) and the ablation as a grid (mechanism x fault kind, flagged or not).

Only worded here: every verdict is analysis/verdict.py's, every number analysis/summary.py's.
"""

from __future__ import annotations

from truestep.analysis.floor import FloorModel
from truestep.analysis.report.blocks import Block, Heading, Para, Table
from truestep.analysis.report.format import fmt_pct, fmt_seconds, fmt_step
from truestep.analysis.summary import ExperimentSummary, GroupSummary, RunAnalysis

PASS_RULE = (
    "the experiment passes when every faulted run and every all-on ablation cell is trajectory-preserving "
    "(and every cost-row cell: peer snapshots off); a cell with one correctness mechanism off is expected "
    "to be flagged."
)


def rule_sentence(floor: FloorModel) -> str:
    """How a run was judged and the experiment decided, in one sentence (the threshold and envelope are
    detailed under Floor)."""
    return f"**The rule:** {judged_clause(floor)}; {PASS_RULE}"


def judged_clause(floor: FloorModel) -> str:
    """How a run of a group with this floor is judged."""
    if not floor.k:
        judged = "a run is correct while it stays bitwise equal to the reference (no floor was measured)"
    elif floor.bitwise:
        judged = (
            "a run is correct while it stays bitwise equal to the failure-free reference in every observable, "
            "because the same-seed repeats were bitwise identical to it"
        )
    elif floor.insufficient:
        judged = "a run that is not bitwise equal to the reference cannot be judged: too few repeats calibrate the floor"
    else:
        judged = (
            "a run is correct while every observable stays within its threshold times the same-seed repeats' "
            "per-step envelope (the floor)"
        )
    return judged


def _failure_free(group: GroupSummary) -> RunAnalysis | None:
    return group.runs.get(group.reference)


def scenario_table(group: GroupSummary) -> Table | None:
    """Each faulted run (not the ablation cells): its verdict and what the recovery cost."""
    reference = _failure_free(group)
    base = reference.goodput.plain_tokens_per_s if reference is not None else 0.0
    rows = []
    for run in group.runs.values():
        if run.role != "faulted":
            continue
        first = run.comparison.first_divergent_step if run.comparison else None
        share = fmt_pct(run.goodput.correct_tokens_per_s / base) if base else "—"
        faults = ", ".join(f"`{f}`" for f in run.faults) or "none"
        rows.append(
            [f"`{run.name}`", faults, run.verdict.label, fmt_step(first), share, fmt_seconds(run.mean_mttr_s)]
        )
    if not rows:
        return None
    headers = [
        "scenario",
        "faults",
        "verdict",
        "first divergence",
        "correct goodput, % of failure-free",
        "MTTR",
    ]
    return Table(headers, rows)


def ablation_grid(group: GroupSummary) -> Table | None:
    """Mechanism switched off (rows) x fault kind (columns): flagged (the run diverged) or not."""
    if not group.cells:
        return None
    modes = list(dict.fromkeys(c.mode for c in group.cells))
    rows: dict[str, dict[str, str]] = {}
    for cell in group.cells:
        mark = f"**flagged** ({cell.verdict.label})" if cell.flagged else "not flagged"
        rows.setdefault(cell.row, {})[cell.mode] = mark
    return Table(
        ["mechanism off \\ fault", *modes],
        [[row, *(r.get(m, "—") for m in modes)] for row, r in rows.items()],
    )


GLOSSARY = (
    "first divergence: the first step whose logged values are not bitwise equal to the reference's "
    "(— none); correct goodput counts only the steps the verdict vouches for; MTTR: mean time from a "
    "fault to the first new step; ∞ in a distance table: a value present in one run only (not comparable); "
    "margin: the factor applied to the floor's leave-one-out spread to make a threshold (docs/measures.md)."
)


def headline_blocks(summary: ExperimentSummary) -> list[Block]:
    main = summary.groups[0]
    head = summary.verdict.head
    why = f": {'; '.join(summary.verdict.failures)}" if summary.verdict.failures else ""
    blocks: list[Block] = [
        Heading(2, "At a glance"),
        Para(f"**{head}**{why}."),
        Para(rule_sentence(main.floor)),
    ]
    for group in summary.groups:
        label = f" ({group.name}: {group.note}, {group.verdict.head})" if group.name else ""
        if group.name:  # another floor, another rule: say it where the group's tables start
            blocks.append(
                Para(
                    f"**{group.name.capitalize()} group ({group.verdict.head}):** {judged_clause(group.floor)}."
                )
            )
        scenarios, grid = scenario_table(group), ablation_grid(group)
        if scenarios is not None:
            blocks += [Para(f"**Scenarios{label}**"), scenarios]
        if grid is not None:
            blocks += [
                Para(f"**Ablation{label}:** which switched-off mechanism each fault kind exposes"),
                grid,
            ]
    return blocks + [Para(GLOSSARY)]
