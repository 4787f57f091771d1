"""The report's opening paragraph: the experiment's verdict (decided by analysis/verdict.py, only worded
here) and, per group, the floor, the faulted runs and the ablation cells in a few sentences."""

from __future__ import annotations

from truestep.analysis.floor import LOSS, FloorModel
from truestep.analysis.report.cost_rows import cost_sentences
from truestep.analysis.report.format import fmt_dev, fmt_rate, fmt_seconds, fmt_step, plural
from truestep.analysis.summary import ExperimentSummary, GroupSummary, RunAnalysis
from truestep.analysis.verdict import MUST_PRESERVE_ROWS, Status


def floor_sentence(floor: FloorModel) -> str:
    k = floor.k
    said = floor.notes + floor.precision
    notes = (" " + " ".join(f"({n})" for n in said)) if said else ""
    if not k:
        return "No floor was measured: exact equality with the reference is assumed." + notes
    repeats = plural(k, "distinct same-seed repeat")
    if floor.bitwise:
        return (
            f"The {repeats} {'was' if k == 1 else 'were'} bitwise identical to the reference in every "
            "observable compared, so a run is correct only while it stays bitwise equal to the reference."
            + notes
        )
    if floor.insufficient:
        return (
            f"The floor is not zero and has only {repeats}: too few to calibrate a threshold, so no run of "
            "this group is judged (insufficient floor)." + notes
        )
    loss = floor.families[LOSS]
    return (
        f"The {repeats} differed from the reference by up to {fmt_dev(floor.max_dloss)} in loss and "
        f"{fmt_dev(floor.max_dgrad_norm)} in grad norm; a run counts as correct while every observable stays "
        f"within its threshold × the repeats' per-step envelope (loss threshold {loss.tau:.3g}); the floor is "
        f"{floor.label}." + notes
    )


def faulted_sentence(run: RunAnalysis) -> str:
    assert run.comparison is not None
    c, v = run.comparison, run.verdict
    injected = [i for i in run.incidents if i.origin == "injected"]
    kinds = sorted({i.kind for i in injected}) or sorted({f.split(":")[0] for f in run.faults})
    what = f"after {plural(len(run.faults), 'injected fault')}"
    what += f" ({', '.join(kinds)})" if kinds else ""
    others = sorted({i.kind for i in run.incidents if i.origin != "injected"})
    what += (
        f", {plural(len(run.incidents) - len(injected), 'failure')} nobody injected ({', '.join(others)})"
        if others
        else ""
    )
    what += f" and {plural(run.resumes, 'resume')}"
    if v.status is Status.BITWISE:
        assert v.evidence is not None
        text = (
            f"**Recovery was correct:** {what}, `{run.name}` was bitwise equal to the reference in everything "
            f"compared ({v.evidence.text})"
        )
    elif v.status is Status.WITHIN_FLOOR:
        assert v.evidence is not None
        text = (
            f"**Recovery was correct within the floor:** {what}, `{run.name}` stayed within the floor in "
            f"everything compared ({v.evidence.text}; first bitwise difference at step "
            f"{fmt_step(c.first_divergent_step)})"
        )
    elif v.status is not Status.VIOLATED:
        text = (
            f"**Recovery could not be verified:** {what}, `{run.name}` is {v.label} (first bitwise difference "
            f"at step {fmt_step(c.first_divergent_step)})"
        )
    else:
        text = f"**Recovery was NOT correct:** {what}, `{run.name}` is {v.label} (first bitwise difference at step {fmt_step(c.first_divergent_step)})"
    gp = run.goodput
    text += (
        f". It delivered {fmt_rate(gp.correct_tokens_per_s)} of correct goodput (plain "
        f"{fmt_rate(gp.plain_tokens_per_s)})"
    )
    if run.mean_mttr_s is not None:
        text += f", with a mean time to recovery of {fmt_seconds(run.mean_mttr_s)}"
    return text + "."


def ablation_sentences(group: GroupSummary) -> list[str]:
    cells = group.cells
    if not cells:
        return []
    flagged = [c for c in cells if c.flagged]
    text = f"Of {len(cells)} ablation cells, {len(flagged)} {'was' if len(flagged) == 1 else 'were'} flagged"
    if flagged:
        text += ": " + ", ".join(f"{c.row}/{c.mode} ({c.verdict.label})" for c in flagged)
    parts = [text + "."]
    all_on = [c for c in cells if c.row == "all-on"]
    broken = [c for c in all_on if c.flagged]
    if broken:
        parts.append(
            "**With every mechanism on, "
            + " and ".join(f"the {c.mode} cell" for c in broken)
            + " was flagged:** recovery is broken even with nothing switched off."
        )
    elif all_on:
        parts.append("The all-on cells stayed correct.")
    quiet = [c for c in cells if c.row not in MUST_PRESERVE_ROWS and not c.flagged]
    if quiet:
        parts.append(
            "Not flagged although a mechanism was off (the switch had no observable effect in that cell): "
            + ", ".join(f"{c.row}/{c.mode}" for c in quiet)
            + "."
        )
    return parts + cost_sentences(group)


def group_sentences(group: GroupSummary) -> list[str]:
    parts = [floor_sentence(group.floor)]
    faulted = [r for r in group.runs.values() if r.role == "faulted"]
    parts += [faulted_sentence(r) for r in faulted]
    if not faulted and not group.cells:
        parts.append("No faulted run was part of this group.")
    return parts + ablation_sentences(group)


def verdict_paragraph(summary: ExperimentSummary) -> str:
    parts = [f"**{summary.verdict.head}.**"]
    if summary.verdict.head == "FAIL":
        parts.append("Failing: " + "; ".join(summary.verdict.failures) + ".")
    if summary.verdict.incomplete:
        parts.append("Not verifiable (missing evidence): " + "; ".join(summary.verdict.incomplete) + ".")
    main, *others = summary.groups
    parts += group_sentences(main)
    for group in others:
        parts.append(f"**{group.name.capitalize()} ({group.note}):** {group.verdict.head}.")
        parts += group_sentences(group)
    return " ".join(parts)
