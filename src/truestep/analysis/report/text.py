"""One run's analysis as compact text, for the CLI: the same content as the report's run section."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from truestep.analysis.report.format import (
    BADPUT_ORDER,
    PHASE_LABELS,
    PHASES,
    fmt_dev,
    fmt_pct,
    fmt_rate,
    fmt_seconds,
    fmt_step,
    plural,
)
from truestep.analysis.report.verdict import digest_text, run_verdict

TEXT_SECTIONS = ("fidelity", "goodput", "badput", "mttr", "checkpoint")


def render_run_text(name: str, analysis: dict[str, Any], sections: Iterable[str] | None = None) -> str:
    """A compact text block for one run's analysis (summary.json's runs[name]), for the CLI.

    `sections` picks among fidelity, goodput, badput, mttr, checkpoint (default: all that are present)."""
    want = set(TEXT_SECTIONS if sections is None else sections)
    unknown = want - set(TEXT_SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; choose from {list(TEXT_SECTIONS)}")
    faults = analysis.get("faults") or []
    lines = [
        f"{name}: {run_verdict(analysis)}"
        + f"  (faults: {'; '.join(faults) if faults else 'none'}; resumes: {analysis.get('restarts', 0)})"
    ]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<11} {text}")

    fid = analysis.get("fidelity")
    if "fidelity" in want and fid is not None:
        missing = fid.get("missing_steps") or []
        compared = fid.get("steps_compared", 0)
        row(
            "fidelity",
            f"{compared}/{compared + len(missing)} steps compared, first divergent "
            f"{fmt_step(fid.get('first_divergent_step'))}, first violation {fmt_step(analysis.get('first_violation_step'))}, "
            f"{fmt_pct(fid.get('fraction_bitwise_equal'))} bitwise",
        )
        row(
            "",
            f"max |Δloss| {fmt_dev(fid.get('max_dloss'))}, mean |Δloss| {fmt_dev(fid.get('mean_dloss'))}, "
            f"max |Δgrad norm| {fmt_dev(fid.get('max_dgrad_norm'))}; {digest_text(fid)}"
            + (f"; floor {analysis['floor_source']}" if analysis.get("floor_source") else ""),
        )
        for w in fid.get("windows") or []:
            row(
                f"resume@{w.get('resumed_at')}",
                f"{w.get('steps')} steps, max |Δloss| {fmt_dev(w.get('max_dloss'))}, "
                f"max |Δgrad norm| {fmt_dev(w.get('max_dgrad_norm'))}"
                + (", layout changed" if w.get("layout_changed") else ""),
            )
    gp = analysis.get("goodput")
    if "goodput" in want and gp:
        row(
            "goodput",
            f"plain {fmt_rate(gp.get('plain_tokens_per_s'))}, correct {fmt_rate(gp.get('correct_tokens_per_s'))} "
            f"({gp.get('correct_steps')}/{gp.get('steps')} steps correct, {gp.get('tokens_per_step', 0):,} tok/step), "
            f"wall {fmt_seconds(gp.get('wall_s'))}",
        )
    if "badput" in want and gp:
        buckets = gp.get("badput_s") or {}
        names = [k for k in BADPUT_ORDER if k in buckets] + [k for k in buckets if k not in BADPUT_ORDER]
        shown = [f"{k.replace('_', ' ')} {fmt_seconds(buckets[k])}" for k in names if buckets[k]]
        row("badput", (", ".join(shown) or "none") + f"; useful {fmt_seconds(gp.get('useful_s'))}")
    if "mttr" in want:
        for inc in analysis.get("mttr") or []:
            phases = inc.get("phases_s") or {}
            parts = " + ".join(f"{PHASE_LABELS[p]} {fmt_seconds(phases.get(p))}" for p in PHASES)
            row(
                "mttr",
                f"{inc.get('kind')} at step {inc.get('pre_fault_step')}: {fmt_seconds(inc.get('mttr_s'))} = {parts}; "
                f"regained after {fmt_seconds(inc.get('regain_s'))}",
            )
    ck = analysis.get("checkpoint")
    if "checkpoint" in want and ck:
        row(
            "checkpoint",
            f"{plural(int(ck.get('saves', 0)), 'save')}, mean blocking {fmt_seconds(ck.get('mean_blocking_s'))}, "
            f"{fmt_pct(ck.get('amortized_blocking_fraction'))} of training time",
        )
    return "\n".join(lines)
