"""The wall-clock timeline of one run, one row per trainer attempt."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import median

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from truestep.analysis.report.plots.style import COLORS, LABELS, save_figure
from truestep.analysis.runlog import RunLog


def _attempt_bounds(run: RunLog) -> dict[int, float]:
    """Trainer attempt -> when its process started (run_start's process_start, else its first record)."""
    began: dict[int, float] = {}
    for e in run.named("run_start"):
        began.setdefault(int(e["attempt"]), float(e.get("process_start", e["time"])))
    for m in run.metrics:
        a = int(m["attempt"])
        began[a] = min(began.get(a, math.inf), m["time"] - m["step_time"])
    return dict(sorted(began.items()))


def _attempt_at(bounds: dict[int, float], t: float) -> int | None:
    current = None
    for attempt, began in bounds.items():
        if began <= t:
            current = attempt
    return current if current is not None else next(iter(bounds), None)


def _merge(spans: list[tuple[float, float]], tol: float) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a - merged[-1][1] <= tol:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b - a) for a, b in merged]


def plot_timeline(
    run: RunLog, path: Path | str, *, violation: int | None = None, title: str | None = None
) -> Path:
    """Wall clock (seconds since job start), one row per trainer attempt: training spans (kept, lost,
    after the first violation), startup, restore, blocking checkpoint saves, detection, teardown and the
    relaunch/requeue gaps, with the injected faults marked."""
    t0 = run.start_time
    bounds = _attempt_bounds(run)
    rows = {attempt: i for i, attempt in enumerate(bounds)}
    segments: dict[str, dict[int, list[tuple[float, float]]]] = {k: {} for k in COLORS}

    def add(kind: str, attempt: int | None, a: float, b: float) -> None:
        if attempt is None or attempt not in rows or b <= a:
            return
        segments[kind].setdefault(attempt, []).append((a - t0, b - t0))

    lost_ids = {id(m) for m in run.superseded}
    step_times = [m["step_time"] for m in run.metrics] or [0.0]
    tol = max(1e-3, 0.5 * median(step_times))
    restores = {int(e["attempt"]): e for e in run.named("checkpoint_restore") if "attempt" in e}
    for attempt, began in bounds.items():
        lines = run.attempt_metrics(attempt)
        first_start = lines[0]["time"] - lines[0]["step_time"] if lines else None
        restore = restores.get(attempt)
        startup_end = first_start if first_start is not None else (restore["time"] if restore else None)
        if startup_end is not None:
            add("startup", attempt, began, startup_end)
        if restore is not None:
            add("restore", attempt, restore["time"] - restore.get("restore_s", 0.0), restore["time"])
        for m in lines:
            if id(m) in lost_ids:
                kind = "lost_work"
            elif violation is not None and m["step"] >= violation:
                kind = "after_violation"
            else:
                kind = "useful"
            add(kind, attempt, m["time"] - m["step_time"], m["time"])
    saves = run.named("checkpoint_save")
    for e in saves:
        attempt = e.get("attempt", _attempt_at(bounds, e["time"]))
        add("checkpoint_blocking", attempt, e["time"] - e.get("blocking_s", 0.0), e["time"])
    faults = run.named("fault_injected")
    teardowns = run.named("teardown_complete")
    for failure in run.named("failure_detected"):
        detected = failure.get("detected_at", failure["time"])
        before = [f["time"] for f in faults if f["time"] <= detected]
        attempt = _attempt_at(bounds, detected)
        if before:
            add("detection", attempt, max(before), detected)
        down = next((e["time"] for e in teardowns if e["time"] >= detected), None)
        if down is not None:
            add("teardown", attempt, detected, down)
    ordered = list(bounds.items())
    for (prev, _), (nxt, began) in zip(ordered, ordered[1:], strict=False):
        prev_times = [e["time"] for e in run.events if e.get("attempt") == prev]
        prev_times += [m["time"] for m in run.attempt_metrics(prev)]
        prev_times += [e["time"] for e in teardowns if e["time"] <= began]
        prev_times = [t for t in prev_times if t <= began]
        if prev_times:
            add("requeue_wait", nxt, max(prev_times), began)

    n = max(1, len(rows))
    fig = Figure(figsize=(10, 1.2 + 0.75 * n), layout="constrained")
    ax = fig.add_subplot()
    order = [
        "requeue_wait",
        "startup",
        "useful",
        "lost_work",
        "after_violation",
        "restore",
        "detection",
        "teardown",
        "checkpoint_blocking",
    ]
    present = []
    for kind in order:
        for attempt, spans in segments[kind].items():
            y = rows[attempt]
            height = 0.34 if kind == "checkpoint_blocking" else 0.6
            merged = _merge(spans, tol if kind in ("useful", "lost_work", "after_violation") else 0.0)
            ax.broken_barh(
                merged,
                (y - height / 2, height),
                facecolors=COLORS[kind],
                edgecolor="#616161" if kind == "requeue_wait" else "none",
                hatch="//" if kind == "requeue_wait" else None,
                lw=0.5,
                zorder=3,
            )
            if kind == "checkpoint_blocking":  # often too short to see: tick every save as well
                ax.plot(
                    [a + w for a, w in merged],
                    [y + 0.36] * len(merged),
                    ls="none",
                    marker="v",
                    ms=4,
                    color=COLORS[kind],
                    zorder=4,
                )
            if kind not in present:
                present.append(kind)
    for i, f in enumerate(faults):
        x = f["time"] - t0
        y = rows.get(_attempt_at(bounds, f["time"]), 0)
        ax.axvline(x, color="#d32f2f", ls=":", lw=1.0, zorder=2)
        ax.plot([x], [y], marker="X", color="#d32f2f", ms=10, mec="white", zorder=5)
        step = f"@{f['step']}" if f.get("step") is not None else ""
        ax.annotate(
            f"{f.get('kind', 'fault')}{step}",
            (x, y + 0.32),
            xytext=(3, 0),
            textcoords="offset points",
            color="#d32f2f",
            fontsize=8,
            zorder=6,
        )
        if i == 0:
            present.append("fault")
    handles = [
        Patch(facecolor=COLORS[k], label=LABELS[k], hatch="//" if k == "requeue_wait" else None)
        for k in present
        if k in COLORS
    ]
    if "fault" in present:
        handles.append(Line2D([], [], marker="X", color="#d32f2f", ls="none", ms=8, label="fault injected"))
    ax.set_yticks(list(rows.values()), [f"attempt {a}" for a in rows])
    ax.set_ylim(n - 0.5, -0.7)  # attempt 0 on top
    ax.set_xlim(0, max(run.wall_s, 1e-6) * 1.01)
    ax.set_xlabel("seconds since job start")
    ax.set_title(title or f"timeline: {run.path.name}")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return save_figure(fig, path)
