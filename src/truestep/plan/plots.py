"""The plan's figures: goodput vs GPU count, goodput vs checkpoint interval (optimum marked), and where
the wall clock goes. Colors and labels of the badput buckets are the report's (analysis/report/plots)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from truestep.analysis.report.format import BADPUT_ORDER
from truestep.analysis.report.plots.style import COLORS, LABELS, save_figure
from truestep.plan.study import PlanResult

CURVE_STYLE = {
    "all on": ("#2e7d32", "-", 2.4),
    "plain (all on)": ("#2e7d32", ":", 1.6),
    "optimizer restore off": ("#c62828", "-", 1.4),
    "RNG restore off": ("#ef6c00", "--", 1.4),
    "data position off": ("#6a1b9a", "-.", 1.4),
    "atomic commit off": ("#ad1457", ":", 1.8),
    "async save off": ("#1565c0", "-", 1.4),
    "warm standby off": ("#00838f", "--", 1.4),
    "collective-timeout detection": ("#5d4037", "-.", 1.6),
}


def plot_gpus(result: PlanResult, target_gpus: int, path: Path) -> Path:
    fig = Figure(figsize=(9, 5.2), layout="constrained")
    ax = fig.add_subplot()
    for name, values in result.sweep.items():
        color, style, width = CURVE_STYLE.get(name, ("#757575", "-", 1.2))
        label = name if name.startswith("plain") else f"correct goodput, {name}"
        ax.plot(
            result.sweep_gpus,
            [100 * v for v in values],
            style,
            color=color,
            lw=width,
            label=label,
            marker=".",
        )
    ax.axvline(target_gpus, color="#9e9e9e", lw=0.8)
    ax.annotate(
        f"plan: {target_gpus:,} GPUs", (target_gpus, 2), rotation=90, fontsize=8, color="#616161", ha="right"
    )
    ax.set_xscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("goodput (% of wall-clock)")
    ax.set_ylim(0, 101)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("Goodput vs GPU count (each mechanism switched off alone)")
    return save_figure(fig, path)


def plot_interval(result: PlanResult, step_s: float, path: Path) -> Path:
    iv = result.intervals
    fig = Figure(figsize=(9, 4.6), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(iv.intervals_s, [100 * v for v in iv.plain], "o-", color="#90a4ae", label="plain goodput")
    ax.plot(iv.intervals_s, [100 * v for v in iv.correct], ".--", color="#2e7d32", label="correct goodput")
    ax.axvspan(iv.optimum_p5_s, iv.optimum_p95_s, color="#43a047", alpha=0.15)
    ax.axvline(iv.optimum_s, color="#2e7d32", lw=2, label=f"simulated optimum {_fmt(iv.optimum_s, step_s)}")
    ax.axvline(iv.young_s, color="#1565c0", ls="--", label=f"Young {_fmt(iv.young_s, step_s)}")
    ax.axvline(iv.daly_s, color="#ad1457", ls=":", lw=2, label=f"Daly {_fmt(iv.daly_s, step_s)}")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (training seconds)")
    ax.set_ylabel("goodput (%)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title("Goodput vs checkpoint interval")
    return save_figure(fig, path)


def plot_breakdown(result: PlanResult, path: Path) -> Path:
    """Every badput bucket as a share of the wall clock, with its 5-95 % range over replicas."""
    h = result.headline
    wall = h.wall_s.mean
    kinds = [k for k in BADPUT_ORDER if k != "unverifiable" and k in h.badput_s]  # no idle kinds simulated
    fig = Figure(figsize=(9, 0.9 + 0.36 * len(kinds)), layout="constrained")
    ax = fig.add_subplot()
    ys = list(range(len(kinds)))[::-1]
    shares = [100 * h.badput_s[k].mean / wall for k in kinds]
    low = [100 * h.badput_s[k].p5 / wall for k in kinds]
    high = [100 * h.badput_s[k].p95 / wall for k in kinds]
    errors = [[max(0.0, s - lo) for s, lo in zip(shares, low, strict=True)]]
    errors.append([max(0.0, hi - s) for s, hi in zip(shares, high, strict=True)])
    ax.barh(
        ys, shares, xerr=errors, color=[COLORS.get(k, "#bdbdbd") for k in kinds], ecolor="#616161", capsize=2
    )
    ax.set_yticks(ys, [LABELS.get(k, k) for k in kinds], fontsize=8)
    for y, share, hi in zip(ys, shares, high, strict=True):
        at = (max(share, hi), y)
        ax.annotate(f"{share:.3g} %", at, xytext=(5, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_xlabel("% of the wall-clock (mean; bars: 5-95 % of replicas)")
    ax.set_title(
        f"Badput: correct goodput {100 * h.correct.mean:.2f} %, plain {100 * h.plain.mean:.2f} % of the wall-clock"
    )
    ax.grid(alpha=0.3, axis="x")
    return save_figure(fig, path)


def _fmt(seconds: float, step_s: float) -> str:
    text = f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.3g} s"
    return f"{text} ({seconds / step_s:.0f} steps)" if step_s > 0 else text
