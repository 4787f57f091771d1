"""The verdicts: one run's in a word or phrase (`run_verdict`), the whole experiment's as the report's
opening paragraph (`verdict_paragraph`)."""

from __future__ import annotations

from typing import Any

from truestep.analysis.report.format import fmt_dev, fmt_rate, fmt_seconds, fmt_step, plural


def run_verdict(analysis: dict[str, Any]) -> str:
    """One word or phrase: 'bitwise', 'within floor', 'VIOLATED at step N', 'INCOMPLETE from step N'
    (steps missing), or 'no reference'."""
    fid = analysis.get("fidelity")
    if fid is None:
        return "no reference"
    violation = analysis.get("first_violation_step")
    if fid.get("first_divergent_step") is None and not fid.get("missing_steps"):
        return "bitwise"
    if analysis.get("preserving", violation is None):
        return "within floor"
    if violation is not None and violation in (fid.get("missing_steps") or []):
        return f"INCOMPLETE from step {violation}"
    return f"VIOLATED at step {violation}"


def digest_text(fid: dict[str, Any]) -> str:
    matches = fid.get("digest_matches") or {}
    final = fid.get("final_digest_equal")
    parts = []
    if matches:
        bad = sorted((int(s) for s, ok in matches.items() if not ok))
        text = f"checkpoint digests {len(matches) - len(bad)}/{len(matches)} equal"
        if bad:
            text += f" (differ at step {', '.join(map(str, bad))})"
        parts.append(text)
    parts.append({True: "final digest equal", False: "final digest DIFFERS", None: "final digest n/a"}[final])
    return ", ".join(parts)


def mean_mttr(analysis: dict[str, Any]) -> float | None:
    values = [i["mttr_s"] for i in analysis.get("mttr") or [] if i.get("mttr_s") is not None]
    return sum(values) / len(values) if values else None


def verdict_paragraph(summary: dict[str, Any]) -> str:
    runs = summary.get("runs", {})
    floor = summary.get("floor") or {}
    margin = summary.get("margin", 2.0)
    faulted = runs.get("faulted")
    cells = summary.get("ablation") or []
    all_on_flagged = [c for c in cells if c["row"] == "all-on" and c.get("flagged")]
    if (faulted and not faulted.get("preserving", True)) or all_on_flagged:
        head = "**FAIL.**"
    elif faulted or any(c["row"] == "all-on" for c in cells):
        head = "**PASS.**"
    else:
        head = "**NO FAULTED RUN.**"
    parts = [head]
    if floor.get("bitwise"):
        parts.append(
            "The same-seed repeat was bitwise identical to the reference, so a run is correct only while "
            "it stays bitwise equal to the reference."
        )
    elif floor:
        parts.append(
            f"The same-seed repeat differed from the reference by up to {fmt_dev(floor.get('max_dloss'))} "
            f"in loss and {fmt_dev(floor.get('max_dgrad_norm'))} in grad norm; a run counts as correct while "
            f"it stays within {margin:g} × that floor."
        )
    if faulted:
        fid = faulted.get("fidelity") or {}
        kinds = sorted({str(i.get("kind")) for i in faulted.get("mttr") or []}) or sorted(
            {str(s).split(":")[0] for s in faulted.get("faults") or []}
        )
        what = f"after {plural(len(faulted.get('faults') or []), 'injected fault')}"
        if kinds:
            what += f" ({', '.join(kinds)})"
        what += f" and {plural(int(faulted.get('restarts') or 0), 'resume')}"
        steps = fid.get("steps_compared", 0)
        verdict = run_verdict(faulted)
        if verdict == "bitwise":
            text = f"**Recovery was correct:** {what}, the faulted run was bitwise equal to the reference on all {steps} steps"
        elif verdict == "within floor":
            text = (
                f"**Recovery was correct within the floor:** {what}, the faulted run stayed within {margin:g} × "
                f"floor on all {steps} steps (first bitwise difference at step {fmt_step(fid.get('first_divergent_step'))})"
            )
        else:
            text = (
                f"**Recovery was NOT correct:** {what}, the faulted run left the floor band at step "
                f"{fmt_step(faulted.get('first_violation_step'))} (first bitwise difference at step "
                f"{fmt_step(fid.get('first_divergent_step'))})"
            )
        final = fid.get("final_digest_equal")
        if final is True:
            text += " and ended on the reference's exact parameters (final digest equal)"
        elif final is False:
            text += "; its final parameter digest differs from the reference's"
        text += "."
        parts.append(text)
        gp = faulted.get("goodput") or {}
        ref_gp = (runs.get("reference") or {}).get("goodput") or {}
        text = (
            f"It delivered {fmt_rate(gp.get('correct_tokens_per_s'))} of correct goodput "
            f"(plain {fmt_rate(gp.get('plain_tokens_per_s'))}"
        )
        if ref_gp.get("plain_tokens_per_s"):
            text += f"; the failure-free reference ran at {fmt_rate(ref_gp['plain_tokens_per_s'])}"
        text += ")"
        mttr = mean_mttr(faulted)
        if mttr is not None:
            text += f", with a mean time to recovery of {fmt_seconds(mttr)}"
        parts.append(text + ".")
    else:
        parts.append("No faulted run was part of this experiment.")
    if cells:
        flagged = [c for c in cells if c.get("flagged")]
        text = (
            f"Of {len(cells)} ablation cells, {len(flagged)} {'was' if len(flagged) == 1 else 'were'} flagged"
        )
        if flagged:
            text += ": " + ", ".join(
                f"{c['row']}/{c['mode']} (step {fmt_step(c.get('first_violation_step'))})" for c in flagged
            )
        parts.append(text + ".")
        if all_on_flagged:
            parts.append(
                "**With every mechanism on, "
                + " and ".join(f"the {c['mode']} cell" for c in all_on_flagged)
                + " was flagged:** recovery is broken even with nothing switched off."
            )
        elif any(c["row"] == "all-on" for c in cells):
            parts.append("The all-on cells stayed correct.")
        quiet = [c for c in cells if c["row"] != "all-on" and not c.get("flagged")]
        if quiet:
            parts.append(
                "Not flagged although a mechanism was off (the switch had no observable effect in that cell): "
                + ", ".join(f"{c['row']}/{c['mode']}" for c in quiet)
                + "."
            )
    return " ".join(parts)
