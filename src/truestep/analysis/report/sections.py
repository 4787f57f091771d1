"""The report's sections as lists of blocks: the floor, one run's fidelity, goodput and badput, time to
recovery, checkpoint overhead, and the ablation matrix. Every value comes from the typed results of
analysis/summary.py; nothing is recomputed here."""

from __future__ import annotations

import math

from truestep.analysis.floor import LOSS, FloorModel
from truestep.analysis.report.blocks import Block, Heading, Para, Table, kv_table
from truestep.analysis.report.cost_rows import cost_blocks
from truestep.analysis.report.format import (
    BADPUT_ORDER,
    PHASES,
    fmt_dev,
    fmt_pct,
    fmt_rate,
    fmt_restore,
    fmt_seconds,
    fmt_step,
    fmt_steps_lost,
)
from truestep.analysis.summary import ExperimentSummary, GroupSummary, RunAnalysis

TOP_TENSORS = 5


def floor_blocks(floor: FloorModel) -> list[Block]:
    rows = [
        ("floor", floor.label),
        ("distinct repeats K", str(floor.k)),
        ("bitwise identical", "yes" if floor.bitwise else "no"),
        ("max |Δloss| of any repeat", fmt_dev(floor.max_dloss)),
        ("max |Δgrad norm| of any repeat", fmt_dev(floor.max_dgrad_norm)),
        ("margin (threshold = margin × the leave-one-out spread)", f"{floor.margin:g}"),
        ("checkpoint steps with state distances", ", ".join(map(str, floor.state_steps)) or "none"),
    ]
    if floor.guarantee is not None:
        rows.append(
            (
                "false-alarm bound per observable",
                f"≤ {floor.order}/{floor.k + 1} = {fmt_pct(floor.guarantee)} for exchangeable runs, whatever "
                "the noise (the margin lowers the real rate: measured in benchmarks/README.md)",
            )
        )
    rows += [("not counted", note) for note in floor.notes]
    rows += [("logged precision", note) for note in floor.precision]
    blocks: list[Block] = [kv_table(rows)]
    if floor.bitwise:
        return blocks
    header = ["observable", "threshold τ", "leave-one-out statistics", "envelope at the first / last step"]
    table = []
    for family in floor.families.values():
        env = family.envelope
        if not env.steps:
            continue
        loo = ", ".join(f"{x:.3g}" for x in family.loo) if family.calibrated else "— (too few repeats)"
        table.append(
            [family.family, f"{family.tau:.3g}", loo, f"{fmt_dev(env.values[0])} / {fmt_dev(env.values[-1])}"]
        )
    blocks.append(Table(header, table))
    return blocks


def fidelity_blocks(run: RunAnalysis, floor: FloorModel) -> list[Block]:
    c, v = run.comparison, run.verdict
    if c is None:
        return []
    violation = v.violation
    rows = [
        ("verdict", v.label),
        ("compared", v.evidence.text if v.evidence else "—"),
        ("missing evidence", "; ".join(g.text for g in v.gaps) or "none"),
        ("first bitwise difference", fmt_step(c.first_divergent_step)),
        (
            "first violation",
            "—"
            if violation is None
            else f"step {violation.step}: {violation.observable} {fmt_dev(violation.value)} > {fmt_dev(violation.threshold)}",
        ),
        ("fraction of steps bitwise equal", fmt_pct(c.fraction_bitwise_equal)),
        ("max |Δloss|", fmt_dev(c.max_dloss)),
        ("mean |Δloss|", fmt_dev(c.mean_dloss)),
        ("max |Δgrad norm|", fmt_dev(c.max_dgrad_norm)),
        ("parameter digests", digest_text(run)),
        ("layout changed on resume", "yes" if c.layout_changed else "no"),
        ("floor", v.floor or floor.label),
    ]
    blocks: list[Block] = [Heading(4, "Fidelity"), kv_table(rows)]
    if c.windows:
        blocks.append(Para("Per resume window (the steps computed by the attempt that resumed):"))
        blocks.append(
            Table(
                [
                    "resumed at step",
                    "steps",
                    "max |Δloss|",
                    "mean |Δloss|",
                    "max |Δgrad norm|",
                    "layout changed",
                ],
                [
                    [
                        str(w.resumed_at),
                        str(w.steps),
                        fmt_dev(w.max_dloss),
                        fmt_dev(w.mean_dloss),
                        fmt_dev(w.max_dgrad_norm),
                        "yes" if w.layout_changed else "no",
                    ]
                    for w in c.windows
                ],
            )
        )
    if c.state:
        blocks += state_blocks(run, floor)
    return blocks


def digest_text(run: RunAnalysis) -> str:
    assert run.comparison is not None
    digests = run.comparison.digests
    if not digests:
        return "none logged at a common step"
    bad = sorted(s for s, ok in digests.items() if not ok)
    text = f"{len(digests) - len(bad)}/{len(digests)} equal"
    return text + (f" (differ at step {', '.join(map(str, bad))})" if bad else "")


COUNTER_KINDS = frozenset({"step"})
"""Optimizer state that counts steps (Adam's `step`): equal in every run at the same step, so ranking it
among the tensors that moved says nothing; the verdict still compares it."""


def state_blocks(run: RunAnalysis, floor: FloorModel) -> list[Block]:
    assert run.comparison is not None
    kinds = sorted({k for d in run.comparison.state for k in d.totals} - COUNTER_KINDS)
    rows = []
    for d in run.comparison.state:
        cells = []
        for kind in kinds:
            family = floor.families.get(kind)
            env = family.envelope.at(d.step) if family else None
            limit = (
                "" if floor.bitwise or env is None or family is None else f" (≤ {fmt_dev(family.tau * env)})"
            )
            cells.append(fmt_dev(d.totals.get(kind)) + limit)
        informative = {k: x for k, x in d.tensors.items() if k.split(":", 1)[0] not in COUNTER_KINDS}
        top = sorted(informative.items(), key=lambda kv: -kv[1])[:TOP_TENSORS]
        rows.append([str(d.step), *cells, ", ".join(f"`{k}` {fmt_dev(x)}" for k, x in top if x)])
    infinite = any(
        math.isinf(x) for d in run.comparison.state for x in (*d.totals.values(), *d.tensors.values())
    )
    return [
        Para(
            "Distances of parameters and optimizer state from the reference's at each common checkpoint step "
            "(L2 over every tensor of a kind; in parentheses the floor's limit), and the tensors that moved most. "
            "Optimizer step counters are not listed (they count steps; the verdict still compares them)."
            + (
                " ∞: a tensor held by one checkpoint only, or with another shape or dtype (not comparable)."
                if infinite
                else ""
            )
        ),
        Table(["checkpoint step", *kinds, "largest per-tensor distances"], rows),
    ]


def goodput_blocks(run: RunAnalysis) -> list[Block]:
    gp = run.goodput
    plain, correct = gp.plain_tokens_per_s, gp.correct_tokens_per_s
    rows = [
        ("wall clock (all attempts)", fmt_seconds(gp.wall_s)),
        ("steps (correct / final trajectory)", f"{gp.correct_steps} / {gp.steps}"),
        ("unverifiable steps (not counted)", str(gp.unverifiable_steps)),
        ("tokens per step", f"{gp.tokens_per_step:,}"),
        ("plain goodput", fmt_rate(plain)),
        ("correct goodput", fmt_rate(correct)),
        ("correct / plain", fmt_pct(correct / plain) if plain else "—"),
        ("useful training time", fmt_seconds(gp.useful_s)),
        ("steps lost per recovery (restored from)", fmt_steps_lost(gp.steps_lost)),
    ]
    wall = gp.wall_s

    def share(x: float) -> str:
        return fmt_pct(x / wall) if wall else "—"

    # Buckets with nothing in them are named in one line, not given a row each (a report of the demo
    # repeated a dozen zero rows per run).
    shown = [k for k in BADPUT_ORDER if gp.badput_s[k]]
    bad_rows = [[k.replace("_", " "), fmt_seconds(gp.badput_s[k]), share(gp.badput_s[k])] for k in shown]
    bad_rows.append(["useful (kept, correct steps)", fmt_seconds(gp.useful_s), share(gp.useful_s)])
    total = sum(gp.badput_s.values()) + gp.useful_s
    bad_rows.append(["**total**", fmt_seconds(total), share(total)])
    empty = [k.replace("_", " ") for k in BADPUT_ORDER if not gp.badput_s[k]]
    blocks: list[Block] = [
        Heading(4, "Goodput"),
        kv_table(rows),
        Heading(4, "Badput"),
        Table(["bucket", "seconds", "% of wall"], bad_rows),
    ]
    if empty:
        blocks.append(Para(f"0 s: {', '.join(empty)}."))
    if gp.inconsistencies:
        blocks.append(Para("**Accounting inconsistencies:** " + "; ".join(gp.inconsistencies) + "."))
    return blocks


MTTR_TEXT = (
    "Per incident -- a fault injected, a failure the supervisor detected that nobody injected (from "
    "the rank's last sign of health the supervisor recorded), or a relaunch after a preemption or a "
    "job that vanished (from the first signal, or its last record) --: fault → detected → all ranks "
    "down → relaunched → restored → first new step (MTTR), and fault → the pre-fault step reached "
    "again (regain). — = the run never got there, or the moment is not known. Restore: the restore "
    "itself within start + restore, and where it came from (peers' memory or a checkpoint on disk); "
    "steps lost: steps done before the incident and done again after it."
)


def mttr_blocks(run: RunAnalysis, explain: bool = True) -> list[Block]:
    """`explain`: with the paragraph saying what the columns are (said once per report)."""
    if not run.incidents:
        return []
    rows = [
        [str(n), inc.kind, inc.origin, str(inc.pre_fault_step)]
        + [fmt_seconds(inc.phases_s[p]) for p in PHASES]
        + [fmt_seconds(inc.mttr_s), fmt_seconds(inc.regain_s)]
        + [fmt_restore(inc), fmt_step(inc.steps_lost)]
        for n, inc in enumerate(run.incidents, 1)
    ]
    return [
        Heading(4, "Time to recovery"),
        *([Para(MTTR_TEXT)] if explain else []),
        Table(
            ["#", "kind", "origin", "pre-fault step", "detect", "teardown", "relaunch", "start + restore"]
            + ["first step", "MTTR", "regain", "restore", "steps lost"],
            rows,
        ),
    ]


def checkpoint_row(run: RunAnalysis) -> list[str]:
    ck = run.checkpoint
    return [
        f"`{run.name}`",
        str(ck.saves),
        fmt_seconds(ck.mean_blocking_s),
        fmt_pct(ck.amortized_blocking_fraction),
    ]


def ablation_blocks(group: GroupSummary) -> list[Block]:
    cells = group.cells
    rows = list(dict.fromkeys(c.row for c in cells))
    modes = list(dict.fromkeys(c.mode for c in cells))
    by = {(c.row, c.mode): c for c in cells}

    def cell(row: str, mode: str) -> str:
        c = by.get((row, mode))
        if c is None:
            return "not run"
        if c.flagged:
            return f"**FLAGGED** ({c.verdict.label})"
        div = c.verdict.first_divergent_step
        return f"ok ({c.verdict.label}" + (f"; first difference at {div})" if div is not None else ")")

    detail = []
    for c in cells:
        gp = group.runs[c.run].goodput
        detail.append(
            [
                f"`{c.row}`",
                c.mode,
                "**yes**" if c.flagged else "no",
                c.verdict.label,
                fmt_step(c.verdict.first_divergent_step),
                fmt_rate(gp.plain_tokens_per_s),
                fmt_rate(gp.correct_tokens_per_s),
            ]
        )
    loss = group.floor.families[LOSS]
    rule = (
        "it differs from the reference in any observable (the floor is bitwise)"
        if group.floor.bitwise
        else f"an observable leaves its threshold × the floor envelope (loss: {loss.tau:.3g} ×)"
    )
    rule += ", or when its evidence is incomplete"
    return [
        Para(
            "Each row switches one recovery mechanism off; each mode recovers from a graceful preemption or a "
            f"hard failure. A cell is flagged when {rule}. A correct instrument flags the rows whose mechanism "
            "matters and never the all-on row" + (" nor a cost row (below)." if cost_blocks(group) else ".")
        ),
        Table(["row", *modes], [[f"`{r}`", *[cell(r, m) for m in modes]] for r in rows]),
        Table(
            ["row", "mode", "flagged", "verdict", "first divergent", "plain goodput", "correct goodput"],
            detail,
        ),
        *cost_blocks(group),
    ]


def cannot_see_blocks(summary: ExperimentSummary) -> list[Block]:
    """What the verdicts above did not and could not look at: the instrument's blind spots in general,
    and, per run, the evidence that was missing or had no counterpart (docs/measures.md)."""
    items = [
        "Anything between checkpoints: parameters and optimizer state are compared only at the checkpoint "
        "steps both runs kept (listed per run), and through the logged observables at every step.",
        "A bug confined to one small tensor: state is judged on per-kind totals (a norm weight is diluted "
        "by the embedding); the per-tensor distances are listed, not judged.",
        "What is never logged: activations, dropout masks, the data order and the RNG streams are seen only "
        "through their effect on the loss, the grad norm and the state.",
        "The data's bytes: the config fingerprint names the data (path, seed, sequence length), not its "
        "content; a changed file at the same path is seen only through its effect.",
        "A difference smaller than the floor: where the floor is not zero, anything within τ × E(s) is by "
        "construction indistinguishable from the platform's own noise.",
        "The false-alarm rate across observables: each observable's bound is r/(K+1); together they are "
        "bounded only by the sum of those bounds. The measured rate is in benchmarks/README.md.",
        "An emulated floor is not a GPU's floor: thresholds calibrated on it say nothing about real hardware.",
    ]
    for group in summary.groups:
        where = f" ({group.name})" if group.name else ""
        for run in group.runs.values():
            c = run.comparison
            if c is None:
                continue
            if run.verdict.gaps:
                items.append(
                    f"`{run.name}`{where}: "
                    + "; ".join(g.text for g in run.verdict.gaps)
                    + " (missing evidence)."
                )
            if c.run_only_checkpoints:
                items.append(
                    f"`{run.name}`{where}: its checkpoints at steps {', '.join(map(str, c.run_only_checkpoints))} "
                    "have no counterpart in the reference; that state was not compared."
                )
            if c.layout_changed:
                items.append(
                    f"`{run.name}`{where}: resumed onto another layout; parameter digests are layout-dependent "
                    "and a same-layout floor does not measure cross-layout noise."
                )
    return [
        Heading(2, "What this verdict cannot see"),
        Table(["not seen by the verdict"], [[item] for item in items]),
    ]
