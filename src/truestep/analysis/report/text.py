"""One run's analysis as compact text, for the CLI: the same content as the report's run section."""

from __future__ import annotations

from collections.abc import Iterable

from truestep.analysis.report.format import (
    BADPUT_ORDER,
    PHASE_LABELS,
    PHASES,
    fmt_dev,
    fmt_pct,
    fmt_rate,
    fmt_restore,
    fmt_seconds,
    fmt_step,
    fmt_steps_lost,
    plural,
)
from truestep.analysis.report.sections import digest_text
from truestep.analysis.summary import RunAnalysis

TEXT_SECTIONS = ("fidelity", "goodput", "badput", "mttr", "checkpoint", "training")


def incident_summary(run: RunAnalysis) -> str:
    """The faults injected, then what else the job recovered from: a failure detected with no fault
    injected, or a relaunch after a preemption or a lost job (analysis/mttr.py)."""
    text = f"faults: {'; '.join(run.faults) if run.faults else 'none injected'}"
    for origin, words in (("detected", "failures detected"), ("relaunch", "relaunches")):
        found = [i.kind for i in run.incidents if i.origin == origin]
        if found:
            text += f"; {words}: {len(found)} ({', '.join(sorted(set(found)))})"
    return text


def render_run_text(run: RunAnalysis, sections: Iterable[str] | None = None) -> str:
    """A compact text block for one run's analysis, for the CLI.

    `sections` picks among fidelity, goodput, badput, mttr, checkpoint (default: all that are present)."""
    want = set(TEXT_SECTIONS if sections is None else sections)
    unknown = want - set(TEXT_SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; choose from {list(TEXT_SECTIONS)}")
    lines = [f"{run.name}: {run.verdict.label}  ({incident_summary(run)}; resumes: {run.resumes})"]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<11} {text}")

    c, v = run.comparison, run.verdict
    if "fidelity" in want and c is not None:
        if v.evidence is not None:
            row("evidence", v.evidence.text + f"; first divergent {fmt_step(c.first_divergent_step)}")
        for gap in v.gaps:
            row("MISSING", gap.text)
        row("floor", v.floor)
        if v.violation is not None:
            x = v.violation
            row(
                "", f"violation: {x.observable} at step {x.step}: {fmt_dev(x.value)} > {fmt_dev(x.threshold)}"
            )
        row(
            "",
            f"max |Δloss| {fmt_dev(c.max_dloss)}, mean |Δloss| {fmt_dev(c.mean_dloss)}, "
            f"max |Δgrad norm| {fmt_dev(c.max_dgrad_norm)}, {fmt_pct(c.fraction_bitwise_equal)} of steps "
            f"bitwise; digests {digest_text(run)}",
        )
        for d in c.state:
            totals = ", ".join(f"{k} {fmt_dev(x)}" for k, x in d.totals.items())
            row(f"state@{d.step}", totals)
        for w in c.windows:
            row(
                f"resume@{w.resumed_at}",
                f"{w.steps} steps, max |Δloss| {fmt_dev(w.max_dloss)}, max |Δgrad norm| {fmt_dev(w.max_dgrad_norm)}"
                + (", layout changed" if w.layout_changed else ""),
            )
    gp = run.goodput
    if "goodput" in want:
        row(
            "goodput",
            f"plain {fmt_rate(gp.plain_tokens_per_s)}, correct {fmt_rate(gp.correct_tokens_per_s)} "
            f"({gp.correct_steps}/{gp.steps} steps correct, {gp.tokens_per_step:,} tok/step), "
            f"wall {fmt_seconds(gp.wall_s)}"
            + (
                f"; attempt(s) {', '.join(map(str, gp.after_completion))} launched after the run completed: "
                "not counted"
                if gp.after_completion
                else ""
            ),
        )
        if gp.steps_lost.sources:
            row("", f"steps lost per recovery: {fmt_steps_lost(gp.steps_lost)}")
    if "badput" in want:
        shown = [
            f"{k.replace('_', ' ')} {fmt_seconds(gp.badput_s[k])}" for k in BADPUT_ORDER if gp.badput_s[k]
        ]
        row("badput", (", ".join(shown) or "none") + f"; useful {fmt_seconds(gp.useful_s)}")
        for problem in gp.inconsistencies:
            row("INCONSISTENT", problem)
    if "mttr" in want:
        for inc in run.incidents:
            parts = " + ".join(f"{PHASE_LABELS[p]} {fmt_seconds(inc.phases_s[p])}" for p in PHASES)
            origin = "" if inc.origin == "injected" else f" ({inc.origin})"
            startup = inc.startup_s or {}
            inside = ", ".join(
                f"{k} {fmt_seconds(v)}" for k, v in startup.items() if isinstance(v, int | float)
            )
            row(
                "mttr",
                f"{inc.kind}{origin} at step {inc.pre_fault_step}: {fmt_seconds(inc.mttr_s)} = {parts}; "
                f"regained after {fmt_seconds(inc.regain_s)}; restore {fmt_restore(inc)}, "
                f"{fmt_step(inc.steps_lost)} step(s) lost"
                + (f"; the new attempt's start-up: {inside}" if inside else ""),
            )
    if "checkpoint" in want:
        ck = run.checkpoint
        row(
            "checkpoint",
            f"{plural(ck.saves, 'save')}, mean blocking {fmt_seconds(ck.mean_blocking_s)}, "
            f"{fmt_pct(ck.amortized_blocking_fraction)} of training time",
        )
    if "training" in want and run.peak_mem_bytes_per_rank:
        estimated = run.memory_estimate_bytes
        said = f"estimated {estimated / 2**30:.2f} GiB per rank; " if estimated is not None else ""
        measured = ", ".join(f"rank {r} {p / 2**30:.2f}" for r, p in enumerate(run.peak_mem_bytes_per_rank))
        row("memory", f"{said}measured peak GiB: {measured}")
    if "training" in want and run.evals:
        step, loss, ppl = run.evals[-1]
        row(
            "eval",
            f"step {step}: held-out loss {loss:.4f}, perplexity {ppl:.2f} ({len(run.evals)} evaluations)",
        )
    return "\n".join(lines)
