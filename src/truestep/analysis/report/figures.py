"""The report's figures for a whole experiment: which plot is drawn for which run, into OUT/plots/, and
the Image blocks that place them. A figure that fails becomes a note, never a failed report.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path

from truestep.analysis.report.blocks import Image
from truestep.analysis.report.document import FULL_ROLES, Figures, ordered_runs
from truestep.analysis.runlog import RunLog, RunLogError
from truestep.analysis.summary import ExperimentSummary, GroupSummary

MAX_RUNS_ON_ENVELOPE = 8


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _attempt(figures: Figures, into: list[Image], caption: str, draw: Callable[[], Path]) -> None:
    try:
        into.append(Image(caption, draw()))
    except Exception as err:  # a figure must never cost the whole report; the note says what failed
        warnings.warn(f"plot '{caption}' failed: {err!r}", stacklevel=2)
        figures.notes.append(f"plot '{caption}' failed: {type(err).__name__}: {err}")


def runs_to_overlay(group: GroupSummary) -> tuple[list, str]:
    """The judged runs an overlay plot draws (at most MAX_RUNS_ON_ENVELOPE, so the plot stays legible):
    violations first, so the runs that matter most are never the ones left out, then the rest in table
    order; and the caption's note naming every run left out ("" when none is)."""
    runs = [
        r for r in ordered_runs(group) if r.comparison is not None and r.role not in ("reference", "floor")
    ]
    runs.sort(key=lambda r: r.verdict.first_violation_step is None)  # stable: table order within each kind
    drawn, rest = runs[:MAX_RUNS_ON_ENVELOPE], runs[MAX_RUNS_ON_ENVELOPE:]
    note = (
        f"; not drawn ({len(rest)}, see the runs table): " + ", ".join(f"`{r.name}`" for r in rest)
        if rest
        else ""
    )
    return [(r.name, r.comparison, r.verdict) for r in drawn], note


def _group_plots(group: GroupSummary, plot_dir: Path, figures: Figures, full: bool) -> None:
    from truestep.analysis.report import plots  # matplotlib is imported only when a report is made

    stem = _safe(group.name or "main")
    judged, left_out = runs_to_overlay(group)
    floor_images = figures.floors.setdefault(group.name, [])
    _attempt(
        figures,
        floor_images,
        "The floor as judged: the repeats' |Δloss| from the reference (grey), their running-max envelope, "
        "the calibrated threshold (green band) and the runs (X: a loss violation)" + left_out,
        lambda: plots.plot_envelope(
            group.floor, judged, plot_dir / f"envelope-{stem}.png", f"floor envelope: {group.name or 'main'}"
        ),
    )
    if any(c.state for _, c, _ in judged) or any(c.state for c in group.floor.comparisons):
        _attempt(
            figures,
            floor_images,
            "Parameter and optimizer-state distances from the reference at checkpoint steps: repeats (grey) and runs"
            + left_out,
            lambda: plots.plot_state(
                group.floor,
                judged,
                plot_dir / f"state-{stem}.png",
                f"state distances: {group.name or 'main'}",
            ),
        )
    if group.cells:
        _attempt(
            figures,
            figures.ablation.setdefault(group.name, []),
            "Ablation: plain vs correct goodput per cell (flagged cells marked)",
            lambda: plots.plot_ablation(group, plot_dir / f"ablation-{stem}.png"),
        )
    if not full:
        return
    try:
        ref_log = RunLog.load(group.runs[group.reference].path)
    except RunLogError as err:
        figures.notes.append(f"no loss plots: {err}")
        ref_log = None
    for run in ordered_runs(group):
        if run.role in ("reference", "floor"):
            continue
        images = figures.runs.setdefault(run.name, [])
        stem = _safe(run.name)
        try:
            log = RunLog.load(run.path)
        except RunLogError as err:
            figures.notes.append(f"no plots for `{run.name}`: {err}")
            continue
        if ref_log is not None:
            _attempt(
                figures,
                images,
                f"Loss of `{run.name}` against the reference (faint x: steps later redone)",
                lambda log=log, stem=stem, name=run.name: plots.plot_loss(
                    ref_log, log, plot_dir / f"loss-{stem}.png", f"loss: {name} vs reference"
                ),
            )
        if run.comparison is not None:
            _attempt(
                figures,
                images,
                f"|Δloss| of `{run.name}` against the reference, with the floor threshold (0 = bitwise equal)",
                lambda run=run, log=log, stem=stem: plots.plot_deviation(
                    run.comparison,
                    group.floor,
                    run.verdict,
                    [w.resumed_at for w in run.comparison.windows],
                    plot_dir / f"deviation-{stem}.png",
                    f"deviation from the reference: {run.name}",
                ),
            )
        if run.role not in FULL_ROLES:
            continue  # its timeline draws the badput table its compact section leaves out
        faults = [
            (e["time"], f"{e.get('kind', 'fault')}@{e.get('step')}") for e in log.named("fault_injected")
        ]
        faults += [(i.fault_time, f"{i.kind} ({i.origin})") for i in run.incidents if i.origin != "injected"]
        _attempt(
            figures,
            images,
            f"Wall-clock timeline of `{run.name}` (the spans the badput table sums)",
            lambda run=run, faults=faults, stem=stem: plots.plot_timeline(
                run.goodput, faults, plot_dir / f"timeline-{stem}.png", f"timeline: {run.name}"
            ),
        )


def make_plots(out: Path, summary: ExperimentSummary) -> Figures:
    """Write OUT/plots/*.png; the first group gets every figure, further groups their floor and ablation."""
    plot_dir = out / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    figures = Figures()
    for index, group in enumerate(summary.groups):
        _group_plots(group, plot_dir, figures, full=index == 0)
    return figures
