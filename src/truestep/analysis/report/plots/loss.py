"""Loss vs step of one run against the reference."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from truestep.analysis.report.plots.events import fault_steps, resume_steps
from truestep.analysis.report.plots.style import COLORS, save_figure
from truestep.analysis.runlog import RunLog


def plot_loss(ref: RunLog, run: RunLog, path: Path | str, title: str | None = None) -> Path:
    """Loss vs step: the reference, the run's final trajectory, its superseded (lost-work) points faintly,
    fault steps and resume steps as vertical markers."""
    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ref_steps = list(ref.final_steps)
    ax.plot(
        ref_steps,
        [ref.final_steps[s]["loss"] for s in ref_steps],
        color="#9e9e9e",
        lw=4,
        alpha=0.6,
        label="reference",
        zorder=2,
    )
    steps = list(run.final_steps)
    few = len(steps) <= 80
    ax.plot(
        steps,
        [run.final_steps[s]["loss"] for s in steps],
        color="#1565c0",
        lw=1.3,
        ls="--",
        marker="o" if few else None,
        ms=3,
        label="this run (final trajectory)",
        zorder=3,
    )
    lost = run.superseded
    if lost:
        ax.scatter(
            [m["step"] for m in lost],
            [m["loss"] for m in lost],
            color=COLORS["lost_work"],
            alpha=0.45,
            marker="x",
            s=28,
            label="superseded steps (lost work)",
            zorder=4,
        )
    for i, (step, kind) in enumerate(fault_steps(run)):
        ax.axvline(
            step, color="#d32f2f", ls=":", lw=1.4, label="fault injected" if i == 0 else None, zorder=1
        )
        ax.annotate(
            kind,
            (step, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -10),
            textcoords="offset points",
            color="#d32f2f",
            fontsize=8,
        )
    for i, step in enumerate(resume_steps(run)):
        ax.axvline(
            step,
            color="#2e7d32",
            ls="-.",
            lw=1.2,
            label="resumed from checkpoint" if i == 0 else None,
            zorder=1,
        )
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title or f"loss: {run.path.name} vs reference")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)  # outside the data
    return save_figure(fig, path)
