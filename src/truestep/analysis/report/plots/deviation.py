"""|Δloss| and |Δgrad norm| per step against the reference, with the floor drawn as it was judged: the
per-step threshold (tau x envelope) of the loss, the floor repeats themselves, the first violation.

Everything drawn comes from analysis results (Comparison, FloorModel, RunVerdict); nothing is
recomputed here, so the figure and the report's tables say the same thing.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from truestep.analysis.fidelity import Comparison
from truestep.analysis.floor import LOSS, FloorModel
from truestep.analysis.report.plots.style import save_figure
from truestep.analysis.verdict import RunVerdict


def log_axis(ax: Axes, values: list[float]) -> tuple[float, float]:
    """A log axis where exact zeros are drawn at ε (two decades below the smallest nonzero value) and its
    tick reads "0"; returns (ε, top)."""
    positive = [v for v in values if 0 < v < math.inf]
    eps = 10.0 ** math.floor(math.log10(min(positive) / 100)) if positive else 1e-9
    top = max(positive) * 20 if positive else 1e-6
    ax.set_yscale("log")
    ax.set_ylim(eps / 3, top * 3)
    ax.axhline(eps, color="#2e7d32", lw=0.8, ls="--", zorder=1)
    ax.annotate(
        "0 = bitwise equal",
        (1.0, eps),
        xycoords=("axes fraction", "data"),
        xytext=(-4, 4),
        textcoords="offset points",
        ha="right",
        fontsize=8,
        color="#2e7d32",
    )
    ax.yaxis.set_major_formatter(
        FuncFormatter(
            lambda y, _p: "0" if math.isclose(y, eps, rel_tol=1e-6) else f"$10^{{{round(math.log10(y))}}}$"
        )
    )
    return eps, top


def shown(values: list[float], eps: float, top: float) -> list[float]:
    return [eps if v == 0 else min(v, top) for v in values]


def floor_repeats_dloss(floor: FloorModel) -> list[list[float]]:
    """Each floor repeat's |Δloss| per step (from the floor's own comparisons)."""
    return [[d.dloss for d in c.steps] for c in floor.comparisons]


def draw_floor_repeats(ax: Axes, floor: FloorModel, eps: float, top: float) -> None:
    """The floor repeats' |Δloss| from the reference, faint grey, one legend entry for all."""
    for i, (c, values) in enumerate(zip(floor.comparisons, floor_repeats_dloss(floor), strict=True)):
        ax.plot(
            [d.step for d in c.steps],
            shown(values, eps, top),
            color="#9e9e9e",
            lw=0.8,
            alpha=0.7,
            label="floor repeats" if i == 0 else None,
            zorder=1,
        )


def threshold_series(floor: FloorModel, family: str = LOSS) -> tuple[list[int], list[float]]:
    """The steps and tau x envelope of a family where the floor judges it (empty when bitwise)."""
    judged = floor.families.get(family)
    if floor.bitwise or judged is None:
        return [], []
    return judged.envelope.steps, [judged.tau * v for v in judged.envelope.values]


def plot_deviation(
    comparison: Comparison,
    floor: FloorModel,
    verdict: RunVerdict,
    resumes: list[int],
    path: Path | str,
    title: str,
) -> Path:
    """|Δloss| (and |Δgrad norm|) per step on a log axis, the loss threshold band, the floor repeats'
    |Δloss| faintly, resumes, the first bitwise difference and the first violation."""
    steps = [d.step for d in comparison.steps]
    dloss = [d.dloss for d in comparison.steps]
    dgrad = [d.dgrad_norm for d in comparison.steps]
    t_steps, t_values = threshold_series(floor)
    repeats = floor_repeats_dloss(floor)
    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax = fig.add_subplot()
    eps, top = log_axis(ax, dloss + dgrad + t_values + [v for r in repeats for v in r])
    if t_steps:
        ax.fill_between(
            t_steps,
            eps / 3,
            t_values,
            step="post",
            color="#c8e6c9",
            alpha=0.6,
            zorder=0,
            label="within the floor threshold",
        )
    draw_floor_repeats(ax, floor, eps, top)
    if dgrad:
        ax.plot(
            steps,
            shown(dgrad, eps, top),
            color="#7e57c2",
            lw=0.8,
            alpha=0.5,
            marker=".",
            ms=3,
            label="|Δ grad norm|",
        )
    violation = verdict.first_violation_step
    if dloss:
        ax.plot(steps, shown(dloss, eps, top), color="#1565c0", lw=1.0, alpha=0.7, zorder=3)
        colors = [
            "#2e7d32" if d == 0 else ("#c62828" if violation is not None and s >= violation else "#1565c0")
            for s, d in zip(steps, dloss, strict=True)
        ]
        ax.scatter(steps, shown(dloss, eps, top), c=colors, s=16, zorder=4)
        ax.plot(
            [], [], color="#1565c0", marker="o", ms=4, label="|Δ loss| (green: 0, red: from the violation)"
        )
    nonfinite = [s for s, d in zip(steps, dloss, strict=True) if d == math.inf]
    if nonfinite:
        ax.scatter(
            nonfinite,
            [top] * len(nonfinite),
            marker="^",
            color="#b71c1c",
            s=40,
            zorder=5,
            label="non-finite loss",
        )
    if comparison.missing_steps:
        ax.scatter(
            comparison.missing_steps,
            [top] * len(comparison.missing_steps),
            marker="x",
            color="#424242",
            s=30,
            zorder=5,
            label="step missing from the run",
        )
    for i, step in enumerate(resumes):
        ax.axvline(step, color="#2e7d32", ls="-.", lw=0.9, alpha=0.6, label="resume" if i == 0 else None)
    divergent = comparison.first_divergent_step
    if divergent is not None and divergent != violation:
        ax.axvline(
            divergent, color="#fb8c00", ls="--", lw=1.2, label=f"first bitwise difference (step {divergent})"
        )
    if verdict.violation is not None:
        v = verdict.violation
        ax.axvline(v.step, color="#c62828", lw=1.6, label=f"first violation (step {v.step}, {v.observable})")
    ax.set_xlabel("step")
    ax.set_ylabel(f"|Δ| vs reference (0 = bitwise, drawn at {eps:.0e})")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="major")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)  # outside the data
    return save_figure(fig, path)
