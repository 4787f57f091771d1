"""Plain vs correct goodput per ablation cell, flagged cells marked, from the group's verdicts."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from truestep.analysis.report.plots.style import save_figure
from truestep.analysis.summary import GroupSummary


def plot_ablation(group: GroupSummary, path: Path | str) -> Path:
    """Correct vs plain goodput (tokens/s) per ablation cell; a flagged cell carries its verdict."""
    cells = group.cells
    fig = Figure(figsize=(9, 1.4 + 0.55 * max(1, len(cells))), layout="constrained")
    ax = fig.add_subplot()
    if not cells:
        ax.text(
            0.5, 0.5, "no ablation cells in this experiment", ha="center", va="center", transform=ax.transAxes
        )
        ax.set_axis_off()
        return save_figure(fig, path)
    ys = list(range(len(cells)))
    h = 0.38
    plain = [group.runs[c.run].goodput.plain_tokens_per_s for c in cells]
    correct = [group.runs[c.run].goodput.correct_tokens_per_s for c in cells]
    ax.barh([y - h / 2 for y in ys], plain, height=h, color="#90a4ae", label="plain goodput")
    edge = ["#c62828" if c.flagged else "none" for c in cells]
    ax.barh(
        [y + h / 2 for y in ys],
        correct,
        height=h,
        color="#43a047",
        edgecolor=edge,
        lw=1.2,
        label="correct goodput",
    )
    right = max(plain + correct + [1e-9])
    for y, c in zip(ys, cells, strict=True):
        text, color = (f"FLAGGED: {c.verdict.short}", "#c62828") if c.flagged else ("ok", "#2e7d32")
        ax.annotate(
            text,
            (right, y),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
            color=color,
            fontweight="bold",
        )
    ax.set_yticks(ys, [f"{c.row} / {c.mode}" for c in cells])
    ax.set_ylim(len(cells) - 0.5, -0.6)
    ax.set_xlim(0, right * 1.6)
    ax.set_xlabel("tokens / s")
    ax.set_title("ablation: plain vs correct goodput per cell")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return save_figure(fig, path)
