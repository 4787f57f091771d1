"""The ablation's cost rows (analysis/verdict.py COST_ROWS: peer snapshots off), worded for the report:
such a cell must stay correct -- it is judged like all-on -- and what it shows is what the mechanism buys,
its steps lost per failure and its MTTR beside the all-on cell of the same fault kind (every mechanism on,
peer snapshots included)."""

from __future__ import annotations

from truestep.analysis.report.blocks import Block, Para, Table
from truestep.analysis.report.format import fmt_seconds, fmt_steps_lost
from truestep.analysis.summary import GroupSummary
from truestep.analysis.verdict import COST_ROWS, CellVerdict

WHAT = {"peer-snapshots-off": "peer snapshots off (a failure recovers from disk instead of peers' memory)"}
"""Cost row -> what switching it off means, in words."""


def pairs(group: GroupSummary) -> list[tuple[CellVerdict, CellVerdict | None]]:
    """Each cost-row cell with the all-on cell of its mode (None when that was not run)."""
    all_on = {c.mode: c for c in group.cells if c.row == "all-on"}
    return [(c, all_on.get(c.mode)) for c in group.cells if c.row in COST_ROWS]


def _costs(group: GroupSummary, cell: CellVerdict | None) -> tuple[str, str]:
    if cell is None:
        return "not run", "—"
    run = group.runs[cell.run]
    return fmt_steps_lost(run.goodput.steps_lost), fmt_seconds(run.mean_mttr_s)


def cost_sentences(group: GroupSummary) -> list[str]:
    found = pairs(group)
    if not found:
        return []
    flagged = [c for c, _ in found if c.flagged]
    parts = []
    for row in dict.fromkeys(c.row for c, _ in found):
        mine = [c for c in flagged if c.row == row]
        if mine:
            parts.append(
                f"**With {WHAT.get(row, row)}, "
                + " and ".join(f"the {c.mode} cell" for c in mine)
                + " was flagged:** that recovery path does not preserve the trajectory."
            )
        else:
            parts.append(
                f"With {WHAT.get(row, row)} the cells stayed correct, as they must: the switch changes what a "
                "recovery costs, not the trajectory."
            )
    for cell, on in found:
        off_lost, off_mttr = _costs(group, cell)
        on_lost, on_mttr = _costs(group, on)
        parts.append(
            f"{cell.row}/{cell.mode}: steps lost per recovery {off_lost}, mean MTTR {off_mttr}; all-on/"
            f"{cell.mode}: {on_lost}, {on_mttr}."
        )
    return parts


def cost_blocks(group: GroupSummary) -> list[Block]:
    found = pairs(group)
    if not found:
        return []
    rows = []
    for cell, on in found:
        off_lost, off_mttr = _costs(group, cell)
        on_lost, on_mttr = _costs(group, on)
        verdict = f"**FLAGGED** ({cell.verdict.label})" if cell.flagged else f"ok ({cell.verdict.label})"
        rows.append([f"`{cell.row}`", cell.mode, verdict, off_lost, on_lost, off_mttr, on_mttr])
    return [
        Para(
            "Cost rows switch off a mechanism that buys time, not correctness: the recovery must be correct with "
            "it and without it, so a cost-row cell is judged like all-on (flagged = the experiment fails). What "
            "the cell shows is the mechanism's price: steps lost per recovery and MTTR without it (this row) "
            "and with it (all-on, same fault kind)."
        ),
        Table(
            ["row", "mode", "verdict", "steps lost: row", "steps lost: all-on", "MTTR: row", "MTTR: all-on"],
            rows,
        ),
    ]
