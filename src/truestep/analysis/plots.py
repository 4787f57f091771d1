"""The report's figures: one PNG per function, each returning the path it wrote.

Every figure is drawn from run directories (RunLog) or summary.json alone, with matplotlib's Agg backend
(no display needed) and no pyplot state: each function builds its own Figure, so they are safe to call
from a CLI, a test or a notebook.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import median
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before anything imports pyplot; the figures below never need a display

from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from truestep.analysis.fidelity import loss_bits  # noqa: E402
from truestep.analysis.runlog import RunLog, finite_abs_diff  # noqa: E402

DPI = 110
_SAVE_KW: dict[str, Any] = {"dpi": DPI, "metadata": {"Software": None}}

# One color per timeline category, shared with the report's badput table wording.
COLORS = {
    "useful": "#43a047",
    "lost_work": "#fb8c00",
    "after_violation": "#c62828",
    "startup": "#90a4ae",
    "restore": "#1e88e5",
    "checkpoint_blocking": "#8e24aa",
    "detection": "#fdd835",
    "teardown": "#6d4c41",
    "requeue_wait": "#d7ccc8",
}
LABELS = {
    "useful": "training (kept, correct)",
    "lost_work": "training later redone (lost work)",
    "after_violation": "training after the first violation",
    "startup": "startup",
    "restore": "checkpoint restore",
    "checkpoint_blocking": "checkpoint save (blocking)",
    "detection": "detection (fault -> detected)",
    "teardown": "teardown",
    "requeue_wait": "relaunch / requeue wait",
}


def _save(fig: Figure, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, **_SAVE_KW)
    return path


def _resume_steps(run: RunLog) -> list[int]:
    return [int(e["step"]) for e in run.named("checkpoint_restore") if e.get("step") is not None]


def _fault_steps(run: RunLog) -> list[tuple[int, str]]:
    return [
        (int(e["step"]), str(e.get("kind", "fault")))
        for e in run.named("fault_injected")
        if e.get("step") is not None
    ]


# --- loss ------------------------------------------------------------------------------------------


def plot_loss(ref: RunLog, run: RunLog, path: Path | str, title: str | None = None) -> Path:
    """Loss vs step: the reference, the run's final trajectory, its superseded (lost-work) points faintly,
    fault steps and resume steps as vertical markers."""
    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ref_steps = list(ref.trajectory)
    ax.plot(
        ref_steps,
        [ref.trajectory[s]["loss"] for s in ref_steps],
        color="#9e9e9e",
        lw=4,
        alpha=0.6,
        label="reference",
        zorder=2,
    )
    steps = list(run.trajectory)
    few = len(steps) <= 80
    ax.plot(
        steps,
        [run.trajectory[s]["loss"] for s in steps],
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
    for i, (step, kind) in enumerate(_fault_steps(run)):
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
    for i, step in enumerate(_resume_steps(run)):
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
    ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


# --- deviation -------------------------------------------------------------------------------------


def _deviations(ref: RunLog, run: RunLog) -> tuple[list[int], list[float], list[float], list[int]]:
    steps, dloss, dgrad, missing = [], [], [], []
    for step, want in ref.trajectory.items():
        got = run.trajectory.get(step)
        if got is None:
            missing.append(step)
            continue
        steps.append(step)
        dloss.append(finite_abs_diff(got["loss"], want["loss"]))
        dgrad.append(finite_abs_diff(got["grad_norm"], want["grad_norm"]))
    return steps, dloss, dgrad, missing


def plot_deviation(
    ref: RunLog,
    run: RunLog,
    floor_value: float,
    margin: float,
    path: Path | str,
    *,
    title: str | None = None,
    violation: int | None = None,
    divergent: int | None = None,
) -> Path:
    """|Δloss| per step against the reference on a log axis, exact zeros drawn at a small ε (labelled
    "0 = bitwise equal"), the band margin x floor shaded, the first violation (and first bitwise
    difference) marked. Without `violation`, the first step whose |Δloss| exceeds the band (or that is
    missing) is marked; pass summary's first_violation_step to include the grad-norm criterion."""
    steps, dloss, dgrad, missing = _deviations(ref, run)
    threshold = margin * floor_value
    positive = [d for d in dloss + dgrad + [threshold] if 0 < d < math.inf]
    # ε: a power of ten two decades below the smallest nonzero value, so its tick can read "0".
    eps = 10.0 ** math.floor(math.log10(min(positive) / 100)) if positive else 1e-9
    top = max(positive) * 20 if positive else 1e-6
    if violation is None:
        bad = [s for s, d in zip(steps, dloss, strict=True) if d > threshold] + missing
        violation = min(bad) if bad else None
    if divergent is None:
        diff = [
            s
            for s in ref.trajectory
            if s in missing or loss_bits(run.trajectory[s]["loss"]) != loss_bits(ref.trajectory[s]["loss"])
        ]
        divergent = min(diff) if diff else None

    def shown(values: list[float]) -> list[float]:
        return [eps if v == 0 else min(v, top) for v in values]

    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ax.set_yscale("log")
    if threshold > 0:
        ax.axhspan(
            eps / 3,
            threshold,
            color="#c8e6c9",
            alpha=0.6,
            zorder=0,
            label=f"within margin x floor ({margin:g} x {floor_value:.3g} = {threshold:.3g})",
        )
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
    if dgrad:
        ax.plot(
            steps,
            shown(dgrad),
            color="#7e57c2",
            lw=0.8,
            alpha=0.5,
            marker=".",
            ms=3,
            label="|Δ grad norm|",
            zorder=2,
        )
    if dloss:
        ax.plot(steps, shown(dloss), color="#1565c0", lw=1.0, alpha=0.7, zorder=3)
        colors = ["#2e7d32" if d == 0 else ("#c62828" if d > threshold else "#1565c0") for d in dloss]
        ax.scatter(steps, shown(dloss), c=colors, s=16, zorder=4)
        ax.plot([], [], color="#1565c0", marker="o", ms=4, label="|Δ loss| (green: 0, red: beyond band)")
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
    if missing:
        ax.scatter(
            missing,
            [top] * len(missing),
            marker="x",
            color="#424242",
            s=30,
            zorder=5,
            label="step missing from the run",
        )
    for i, step in enumerate(_resume_steps(run)):
        ax.axvline(step, color="#2e7d32", ls="-.", lw=0.9, alpha=0.6, label="resume" if i == 0 else None)
    if divergent is not None and divergent != violation:
        ax.axvline(
            divergent, color="#fb8c00", ls="--", lw=1.2, label=f"first bitwise difference (step {divergent})"
        )
    if violation is not None:
        ax.axvline(violation, color="#c62828", lw=1.6, label=f"first violation (step {violation})")
    ax.set_ylim(eps / 3, top * 3)
    ax.yaxis.set_major_formatter(
        FuncFormatter(
            lambda y, _pos: "0" if math.isclose(y, eps, rel_tol=1e-6) else f"$10^{{{round(math.log10(y))}}}$"
        )
    )
    ax.set_xlabel("step")
    ax.set_ylabel(f"|Δ| vs reference (0 = bitwise, drawn at {eps:.0e})")
    ax.set_title(title or f"deviation from the reference: {run.path.name}")
    ax.grid(alpha=0.3, which="major")
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, path)


# --- timeline --------------------------------------------------------------------------------------


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
    return _save(fig, path)


# --- ablation --------------------------------------------------------------------------------------


def plot_ablation(summary: dict[str, Any], path: Path | str) -> Path:
    """Correct vs plain goodput (tokens/s) per ablation cell, flagged cells marked."""
    cells = summary.get("ablation") or []
    fig = Figure(figsize=(9, 1.4 + 0.55 * max(1, len(cells))), layout="constrained")
    ax = fig.add_subplot()
    if not cells:
        ax.text(
            0.5, 0.5, "no ablation cells in this experiment", ha="center", va="center", transform=ax.transAxes
        )
        ax.set_axis_off()
        return _save(fig, path)
    ys = list(range(len(cells)))
    h = 0.38
    plain = [c.get("plain_tokens_per_s") or 0.0 for c in cells]
    correct = [c.get("correct_tokens_per_s") or 0.0 for c in cells]
    ax.barh([y - h / 2 for y in ys], plain, height=h, color="#90a4ae", label="plain goodput")
    edge = ["#c62828" if c.get("flagged") else "none" for c in cells]
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
        if c.get("flagged"):
            where = c.get("first_violation_step")
            text = f"FLAGGED (violation at step {where})" if where is not None else "FLAGGED"
            color = "#c62828"
        else:
            text, color = "ok", "#2e7d32"
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
    ax.set_yticks(ys, [f"{c['row']} / {c['mode']}" for c in cells])
    ax.set_ylim(len(cells) - 0.5, -0.6)
    ax.set_xlim(0, right * 1.45)
    ax.set_xlabel("tokens / s")
    ax.set_title("ablation: plain vs correct goodput per cell")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return _save(fig, path)
