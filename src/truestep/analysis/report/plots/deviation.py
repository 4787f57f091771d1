"""|Δloss| and |Δgrad norm| per step of one run against the reference, with the floor band."""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from truestep.analysis.fidelity import loss_bits
from truestep.analysis.report.plots.events import resume_steps
from truestep.analysis.report.plots.style import save_figure
from truestep.analysis.runlog import RunLog, finite_abs_diff


def _deviations(ref: RunLog, run: RunLog) -> tuple[list[int], list[float], list[float], list[int]]:
    steps, dloss, dgrad, missing = [], [], [], []
    for step, want in ref.final_steps.items():
        got = run.final_steps.get(step)
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
            for s in ref.final_steps
            if s in missing or loss_bits(run.final_steps[s]["loss"]) != loss_bits(ref.final_steps[s]["loss"])
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
    for i, step in enumerate(resume_steps(run)):
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
    return save_figure(fig, path)
