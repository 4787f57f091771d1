"""The wall-clock timeline of one run, one row per trainer attempt: exactly the spans analysis/goodput.py
summed into the badput table (figure and table cannot disagree), with the injected faults marked."""

from __future__ import annotations

from pathlib import Path
from statistics import median

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from truestep.analysis.goodput import WORK_KINDS, Goodput, Span, attempt_at
from truestep.analysis.report.plots.style import COLORS, LABELS, save_figure

DRAW_ORDER = (
    "not_running",
    "refused",
    "requeue_wait",
    "startup",
    "useful",
    "lost_work",
    "unverifiable",
    "after_violation",
    "restore",
    "detection",
    "teardown",
    "checkpoint_blocking",
)


def _merge(spans: list[Span], t0: float, tol: float) -> list[tuple[float, float]]:
    """(start, width) bars in seconds since t0; consecutive spans closer than tol drawn as one bar."""
    merged: list[list[float]] = []
    for s in sorted(spans, key=lambda s: s.start):
        a, b = s.start - t0, s.end - t0
        if merged and a - merged[-1][1] <= tol:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b - a) for a, b in merged]


def plot_timeline(gp: Goodput, faults: list[tuple[float, str]], path: Path | str, title: str) -> Path:
    """`faults`: (wall-clock time, label) of every injected fault."""
    t0 = gp.start_time
    attempts = list(gp.attempts) or [0]
    rows = {attempt: i for i, attempt in enumerate(attempts)}

    def row(attempt: int | None) -> int:
        return rows.get(attempt if attempt is not None else attempts[0], 0)

    work = [s.duration for s in gp.spans if s.kind in WORK_KINDS] or [0.0]
    tol = max(1e-3, 0.5 * median(work))
    n = len(rows)
    fig = Figure(figsize=(10, 1.2 + 0.75 * n), layout="constrained")
    ax = fig.add_subplot()
    present = []
    for kind in DRAW_ORDER:
        mine = [s for s in gp.spans if s.kind == kind]
        for y in sorted({row(s.attempt) for s in mine}):
            spans = [s for s in mine if row(s.attempt) == y]
            height = 0.34 if kind == "checkpoint_blocking" else 0.6
            bars = _merge(spans, t0, tol if kind in WORK_KINDS else 0.0)
            ax.broken_barh(
                bars,
                (y - height / 2, height),
                facecolors=COLORS[kind],
                edgecolor="#616161" if kind == "requeue_wait" else "none",
                hatch="//" if kind == "requeue_wait" else None,
                lw=0.5,
                zorder=3,
            )
            if kind == "checkpoint_blocking":  # often too short to see: tick every save as well
                ax.plot(
                    [a + w for a, w in bars],
                    [y + 0.36] * len(bars),
                    ls="none",
                    marker="v",
                    ms=4,
                    color=COLORS[kind],
                    zorder=4,
                )
        if mine:
            present.append(kind)
    for t, label in faults:
        x, y = t - t0, row(attempt_at(gp.attempts, t))
        ax.axvline(x, color="#d32f2f", ls=":", lw=1.0, zorder=2)
        ax.plot([x], [y], marker="X", color="#d32f2f", ms=10, mec="white", zorder=5)
        ax.annotate(
            label,
            (x, y + 0.32),
            xytext=(3, 0),
            textcoords="offset points",
            color="#d32f2f",
            fontsize=8,
            zorder=6,
        )
    handles: list[Patch | Line2D] = [
        Patch(facecolor=COLORS[k], label=LABELS[k], hatch="//" if k == "requeue_wait" else None)
        for k in present
    ]
    if faults:
        handles.append(Line2D([], [], marker="X", color="#d32f2f", ls="none", ms=8, label="fault injected"))
    ax.set_yticks(list(rows.values()), [f"attempt {a}" for a in rows])
    ax.set_ylim(n - 0.5, -0.7)  # the first attempt on top
    ax.set_xlim(0, max(gp.wall_s, 1e-6) * 1.01)
    ax.set_xlabel("seconds since job start")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return save_figure(fig, path)
