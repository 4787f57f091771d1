"""The plan as blocks, rendered by the report's own writers (analysis/report: markdown and the
self-contained HTML), plus plan.json: OUT/plan.md, OUT/plan.html, OUT/plan.json, OUT/plots/plan_*.png."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from truestep.analysis.report.blocks import Block, Heading, Image, Para, Table
from truestep.analysis.report.format import BADPUT_ORDER, fmt_pct, fmt_rate, fmt_seconds
from truestep.analysis.report.html import render_html
from truestep.analysis.report.markdown import render_markdown
from truestep.analysis.report.plots.style import LABELS
from truestep.analysis.summary import to_json
from truestep.core.fsio import atomic_write, make_dir
from truestep.plan.build import Assembled
from truestep.plan.inputs import get, keys
from truestep.plan.scenario import gpu_fraction, spares_warning
from truestep.plan.snapshots import SnapshotStudy
from truestep.plan.study import PlanResult, Stat


def _pct(s: Stat) -> list[str]:
    return [fmt_pct(s.mean), fmt_pct(s.p5), fmt_pct(s.p95)]


def _hours(s: Stat) -> list[str]:
    return [f"{s.mean / 3600:,.2f} h", f"{s.p5 / 3600:,.2f} h", f"{s.p95 / 3600:,.2f} h"]


def _interval(seconds: float, step_s: float) -> str:
    text = fmt_seconds(seconds)
    return f"{text} ({seconds / step_s:,.0f} steps)" if step_s > 0 else text


def _value(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return f"`{v}`" if isinstance(v, str) else str(v)


def summary_text(a: Assembled, r: PlanResult) -> str:
    job, h = a.inputs.job, r.headline
    return (
        f"**{job.gpus:,} GPUs** ({job.gpus_per_node} per node), failure-free training of "
        f"{_hours_text(h.wall_s.mean * h.plain.mean)}, checkpoint every {_interval(h.interval_s, job.step_time_s)}: "
        f"**correct goodput {fmt_pct(h.correct.mean)}** (5-95 %: {fmt_pct(h.correct.p5)}-{fmt_pct(h.correct.p95)}), "
        f"plain goodput {fmt_pct(h.plain.mean)}; {h.failures.mean:,.1f} failures and {h.preemptions.mean:,.1f} "
        f"preemptions on average, mean recovery {fmt_seconds(h.mttr_s.mean)}, expected lost work "
        f"{h.lost_work_s.mean / 3600:,.2f} h ({h.lost_work_s.mean / 3600 * job.gpus:,.0f} GPU-hours)."
        + unscaled_text(a, r)
    )


def unscaled_text(a: Assembled, r: PlanResult) -> str:
    """The headline's caveat: costs measured at another scale and taken as the target's, with the range
    of correct goodput between them as measured and at truestep's at-scale assumptions."""
    if not a.unscaled or a.measured is None:
        return ""
    listed = ", ".join(
        f"`{key.removeprefix('costs.')}` {fmt_seconds(low)}"
        + (f" (assumed at scale: {fmt_seconds(high)})" if high > low else "")
        for key, (low, high) in a.unscaled.items()
    )
    text = (
        f" **Not extrapolated:** {listed} were measured at {a.measured.world} ranks and are taken as the "
        f"{a.inputs.job.gpus:,}-GPU job's"
    )
    if r.unscaled_correct is not None:
        low, high = r.unscaled_correct
        text += (
            f"; with them at the assumed at-scale values correct goodput is {fmt_pct(high)} instead of "
            f"{fmt_pct(low)} ({min(low, high) * 100:.1f}-{max(low, high) * 100:.1f} %: a range, not a point; "
            "set them to measured values at scale to narrow it)"
        )
    return text + "."


def _hours_text(seconds: float) -> str:
    return f"{seconds / 86400:,.2f} days" if seconds >= 2 * 86400 else fmt_seconds(seconds)


def build_blocks(a: Assembled, r: PlanResult, images: dict[str, Path]) -> list[Block]:
    inputs, h, iv = a.inputs, r.headline, r.intervals
    step = inputs.job.step_time_s
    out: list[Block] = [Heading(1, "truestep plan"), Para(summary_text(a, r))]
    warn = spares_warning(inputs)
    notes = [*a.notes, *([warn] if warn else [])]
    rows = [
        ["plain goodput (final trajectory / wall)", *_pct(h.plain)],
        ["correct goodput (reference trajectory / wall)", *_pct(h.correct)],
        ["wall-clock", *_hours(h.wall_s)],
        ["expected lost work", *_hours(h.lost_work_s)],
        ["failures", *(f"{v:,.1f}" for v in (h.failures.mean, h.failures.p5, h.failures.p95))],
        ["preemptions", *(f"{v:,.1f}" for v in (h.preemptions.mean, h.preemptions.p5, h.preemptions.p95))],
        ["mean recovery (MTTR)", *(fmt_seconds(v) for v in (h.mttr_s.mean, h.mttr_s.p5, h.mttr_s.p95))],
    ]
    if step > 0 and inputs.job.tokens_per_step > 0:
        rate = inputs.job.tokens_per_step / (step + inputs.job.step_overhead_s)
        for name, s in (("plain goodput", h.plain), ("correct goodput", h.correct)):
            rows.append([f"{name} in tokens/s", *(fmt_rate(v * rate) for v in (s.mean, s.p5, s.p95))])
    out += [
        Heading(2, "Goodput"),
        Para(
            f"Means over {inputs.job.replicas:,} replicas, with the 5 % and 95 % replicas (standard error of "
            f"the correct-goodput mean: {100 * h.correct.se:.3f} points). Per allocated GPU (spare nodes "
            f"included) multiply by {gpu_fraction(inputs):.4f}."
        ),
        Table(["measure", "mean", "5 %", "95 %"], rows),
        Heading(2, "Badput"),
        Para(
            "The report's buckets (docs/measures.md), in hours of wall-clock per job; `unverifiable` is 0 in a plan."
        ),
        Table(
            ["bucket", "mean", "share of wall", "5 %", "95 %"],
            [
                [
                    LABELS.get(k, k) if k in LABELS else k,
                    f"{s.mean / 3600:,.3f} h",
                    fmt_pct(s.mean / h.wall_s.mean),
                ]
                + [f"{s.p5 / 3600:,.3f} h", f"{s.p95 / 3600:,.3f} h"]
                for k in BADPUT_ORDER
                if k in h.badput_s  # the simulator has no idle kinds (analysis/idle.py)
                for s in [h.badput_s[k]]
            ],
        ),
        Image("Where the wall-clock goes", images["breakdown"]),
        Heading(2, "Checkpoint interval"),
        Para(
            f"The simulated optimum minimizes the expected wall-clock (a fit of a/τ + bτ + c around the best "
            f"of {len(iv.intervals_s)} simulated intervals; the range is a bootstrap over replicas). Young and "
            f"Daly use δ = {fmt_seconds(iv.delta_s)} (what one save stalls training) and M = "
            f"{fmt_seconds(iv.mtbf_s)} (the job's mean time between interruptions that lose work); neither "
            "knows that an async save is durable only after its write and commit."
        ),
        Table(
            ["interval", "value"],
            [
                ["simulated optimum", _interval(iv.optimum_s, step)],
                [
                    "its 5-95 % range",
                    f"{_interval(iv.optimum_p5_s, step)} - {_interval(iv.optimum_p95_s, step)}",
                ],
                ["Young: sqrt(2 δ M)", _interval(iv.young_s, step)],
                ["Daly (2006)", _interval(iv.daly_s, step)],
                ["used for the headline", _interval(h.interval_s, step)],
            ],
        ),
        Image("Goodput vs checkpoint interval", images["interval"]),
        Heading(2, "What each mechanism buys"),
        Para(
            "Every mechanism on, then one switched off at a time (each at Daly's interval for its own costs, "
            "or the interval you set). A restore mechanism that is off corrupts the resumes the ablation showed "
            "it corrupts: work after the first such resume is off the reference trajectory and does not count."
        ),
        Table(
            [
                "setting",
                "plain goodput",
                "correct goodput",
                "correct 5-95 %",
                "Δ correct vs all on",
                "interval",
            ],
            [
                [name, fmt_pct(p.mean), fmt_pct(c.mean), f"{fmt_pct(c.p5)} - {fmt_pct(c.p95)}"]
                + [f"{100 * (c.mean - r.mechanisms['all on'][1].mean):+.2f} pts", _interval(t, step)]
                for name, (p, c, t) in r.mechanisms.items()
            ],
        ),
        Heading(2, "Goodput vs GPU count"),
        Para(
            "The same job (same failure-free length) at every size: failures grow with the node count, save "
            "and restore costs follow the scaling model (docs/plan.md), other costs stay as planned."
        ),
        Image("Goodput vs GPU count", images["gpus"]),
        *snapshot_blocks(r.snapshots, step),
        Heading(2, "Sensitivity"),
        Para(
            f"Correct goodput with one input at 50 % and at 150 % (baseline {fmt_pct(r.base_correct)}), largest effect first."
        ),
        Table(
            ["input", "value", "at 50 %", "at 150 %", "spread"],
            [
                [f"`{row.key}`", _value(row.value), fmt_pct(row.low), fmt_pct(row.high)]
                + [f"{100 * abs(row.high - row.low):.2f} pts"]
                for row in r.sensitivity
            ],
        ),
        Heading(2, "Inputs"),
        Para("Every input with where its value came from: measured, extrapolated, set, or assumed."),
        Table(
            ["input", "value", "source"],
            [[f"`{k}`", _value(get(inputs, k)), a.provenance.label(k)] for k in keys(inputs)],
        ),
    ]
    if a.measured is not None and a.measured.checkpoint_bytes:
        m = a.measured
        out.append(
            Para(
                f"Measured checkpoint: {m.checkpoint_bytes:,.0f} bytes for {m.params:,.0f} parameters "
                f"({m.checkpoint_bytes / m.params:.1f} B/param with per-rank state and metadata) at {m.world} ranks."
            )
        )
    if notes:
        out += [Heading(2, "Notes"), *(Para(n) for n in notes)]
    return out


def _k(k: int) -> str:
    return "off (disk only)" if k == 0 else f"every {k} step{'s' if k > 1 else ''}"


def snapshot_blocks(study: SnapshotStudy | None, step_s: float) -> list[Block]:
    """Peer snapshots off vs every k steps (plan/snapshots.py)."""
    out: list[Block] = [Heading(2, "Peer snapshots")]
    if study is None:
        return out + [
            Para(
                "Not simulated: snapshots are taken every k steps, and the plan has no step time. Set "
                "`job.step_time_s` (and `mechanisms.snapshot_every_steps`) to see what they buy."
            )
        ]
    out.append(
        Para(
            "A failure restores the last agreed in-memory snapshot from peers (at most k steps lost) unless its "
            "buddies were lost with it or a preemption killed the whole job: then the newest checkpoint serves. "
            f"Every setting at the headline's checkpoint interval ({_interval(study.interval_s, step_s)}); "
            "`mechanisms.snapshot_every_steps` is the planned setting (0 = off), the others are what-ifs."
        )
    )
    out.append(
        Table(
            ["peer snapshots", "plain goodput", "correct goodput", "correct 5-95 %", "steps lost per failure"]
            + ["restored from memory", "mean recovery", "snapshot stalls"],
            [
                [_k(row.k), fmt_pct(row.plain.mean), fmt_pct(row.correct.mean)]
                + [f"{fmt_pct(row.correct.p5)} - {fmt_pct(row.correct.p95)}", f"{row.steps_lost:,.2f}"]
                + [fmt_pct(row.from_memory), fmt_seconds(row.mttr_s), fmt_pct(row.overhead)]
                for row in study.rows
            ],
        )
    )
    k_all = list(study.sweep)
    out += [
        Para("Correct goodput and steps lost per failure at every GPU count, each snapshot setting above:"),
        Table(
            ["GPUs", *(f"correct: {_k(k)}" for k in k_all), *(f"steps lost: {_k(k)}" for k in k_all)],
            [
                [f"{g:,}"]
                + [fmt_pct(study.sweep[k][n]) for k in k_all]
                + [f"{study.sweep_lost[k][n]:,.2f}" for k in k_all]
                for n, g in enumerate(study.sweep_gpus)
            ],
        ),
    ]
    return out


def write_plan(out: Path, a: Assembled, r: PlanResult) -> tuple[Path, Path]:
    from truestep.plan import plots

    make_dir(out)
    make_dir(out / "plots")
    images = {
        "gpus": plots.plot_gpus(r, a.inputs.job.gpus, out / "plots" / "plan_gpus.png"),
        "interval": plots.plot_interval(r, a.inputs.job.step_time_s, out / "plots" / "plan_interval.png"),
        "breakdown": plots.plot_breakdown(r, out / "plots" / "plan_breakdown.png"),
    }
    blocks = build_blocks(a, r, images)
    md, html = out / "plan.md", out / "plan.html"
    atomic_write(md, render_markdown(blocks, out).encode(), durable=False)
    atomic_write(html, render_html(blocks, "truestep plan").encode(), durable=False)
    record = {
        "inputs": dataclasses.asdict(a.inputs),
        "provenance": {k: a.provenance.label(k) for k in keys(a.inputs)},
        "notes": a.notes,
        "result": r,
    }
    atomic_write(out / "plan.json", to_json(record).encode(), durable=False)
    return md, html
