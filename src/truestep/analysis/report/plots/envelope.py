"""The floor as the verdict uses it: the repeats' deviations from the reference, their per-step envelope
and the calibrated threshold, with the runs judged against it (loss per step; state distances per
checkpoint step). Drawn from the FloorModel and the runs' Comparisons and verdicts only."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from truestep.analysis.fidelity import Comparison
from truestep.analysis.floor import LOSS, FloorModel, observations
from truestep.analysis.report.plots.deviation import draw_floor_repeats, floor_repeats_dloss, log_axis, shown
from truestep.analysis.report.plots.style import save_figure
from truestep.analysis.verdict import RunVerdict

JudgedRun = tuple[str, Comparison, RunVerdict]
PALETTE = ("#1565c0", "#c62828", "#ef6c00", "#6a1b9a", "#00838f", "#558b2f", "#ad1457", "#4e342e")


def plot_envelope(floor: FloorModel, runs: list[JudgedRun], path: Path | str, title: str) -> Path:
    """|Δloss| per step: repeats (grey), envelope and threshold, the runs (a marker at each violation)."""
    family = floor.families[LOSS]
    env = family.envelope
    limit = [family.tau * v for v in env.values]
    repeats = floor_repeats_dloss(floor)
    fig = Figure(figsize=(9, 4.4), layout="constrained")
    ax = fig.add_subplot()
    values = (
        limit + env.values + [v for r in repeats for v in r] + [d.dloss for _, c, _ in runs for d in c.steps]
    )
    eps, top = log_axis(ax, values)
    if env.steps:
        ax.fill_between(
            env.steps,
            eps / 3,
            limit,
            step="post",
            color="#c8e6c9",
            alpha=0.6,
            label=f"threshold: {family.tau:.3g} × envelope",
        )
        ax.step(
            env.steps,
            shown(env.values, eps, top),
            where="post",
            color="#424242",
            lw=1.2,
            label="envelope (running max of the repeats)",
        )
    draw_floor_repeats(ax, floor, eps, top)
    for (name, c, verdict), color in zip(runs, PALETTE * 4, strict=False):
        ax.plot(
            [d.step for d in c.steps],
            shown([d.dloss for d in c.steps], eps, top),
            color=color,
            lw=1.1,
            label=f"{name}: {verdict.short}",
        )
        v = verdict.violation
        if v is not None and v.observable == LOSS:
            ax.scatter([v.step], shown([v.value], eps, top), marker="X", s=60, color=color, zorder=5)
    ax.set_xlabel("step")
    ax.set_ylabel("|Δ loss| vs reference")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)  # outside the data
    return save_figure(fig, path)


def plot_state(floor: FloorModel, runs: list[JudgedRun], path: Path | str, title: str) -> Path:
    """One panel per state kind: distance from the reference at each checkpoint step for the repeats and
    the runs, with the threshold (tau x envelope)."""
    kinds = sorted(
        {k for c in floor.comparisons for d in c.state for k in d.totals}
        | {k for _, c, _ in runs for d in c.state for k in d.totals}
    )
    fig = Figure(figsize=(9, 2.4 * max(1, len(kinds))), layout="constrained")
    for index, kind in enumerate(kinds, 1):
        ax = fig.add_subplot(len(kinds), 1, index)
        series = [observations(c).get(kind, {}) for c in floor.comparisons]
        judged = floor.families.get(kind)
        limit = [judged.tau * v for v in judged.envelope.values] if judged and not floor.bitwise else []
        run_series = [observations(c).get(kind, {}) for _, c, _ in runs]
        values = limit + [v for s in series + run_series for v in s.values()]
        eps, top = log_axis(ax, values)
        if limit and judged is not None:
            ax.plot(
                judged.envelope.steps,
                shown(limit, eps, top),
                color="#2e7d32",
                ls="--",
                lw=1.0,
                label="threshold",
            )
        for i, s in enumerate(series):
            ax.plot(
                list(s),
                shown(list(s.values()), eps, top),
                "o",
                color="#9e9e9e",
                ms=4,
                label="floor repeats" if i == 0 else None,
            )
        for (name, _, _), s, color in zip(runs, run_series, PALETTE * 4, strict=False):
            ax.plot(list(s), shown(list(s.values()), eps, top), "-o", color=color, ms=4, lw=1.0, label=name)
        ax.set_ylabel(f"‖Δ {kind}‖")
        ax.grid(alpha=0.3)
        if index == 1:
            ax.set_title(title)
            ax.legend(
                loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False
            )  # outside the data
    if fig.axes:
        fig.axes[-1].set_xlabel("checkpoint step")
    return save_figure(fig, path)
