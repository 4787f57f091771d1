"""The experiment report: OUT/report.md, a self-contained OUT/report.html and OUT/plots/*.png, all drawn
from summary.json (experiment/plan.py `summarize`) and the run directories.

The report is built once as a list of blocks (heading, paragraph, table, image) and rendered twice, so
the Markdown and the HTML always say the same thing. The HTML embeds its images as data URIs and its
CSS inline: it can be mailed or archived as one file.

`render_run_text` is the same content for one run as compact text, for the CLI.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from truestep.analysis.runlog import RunLog

BADPUT_ORDER = (
    "startup",
    "checkpoint_blocking",
    "restore",
    "lost_work",
    "detection",
    "teardown",
    "requeue_wait",
    "after_violation",
    "other",
)
PHASES = ("detect", "teardown", "relaunch", "restore", "first_step")
PHASE_LABELS = {
    "detect": "detect",
    "teardown": "teardown",
    "relaunch": "relaunch",
    "restore": "start+restore",
    "first_step": "first step",
}
TEXT_SECTIONS = ("fidelity", "goodput", "badput", "mttr", "checkpoint")


# --- number formatting -----------------------------------------------------------------------------


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def fmt_seconds(x: float | None) -> str:
    """2-3 significant decimals: 0.0153 -> '15.3 ms', 0.153 -> '0.153 s', 1.534 -> '1.53 s', 153.4 -> '153.4 s'."""
    if x is None:
        return "—"
    if not _finite(x):
        return "∞"
    a = abs(x)
    if a == 0:
        return "0 s"
    if a >= 99.95:
        return f"{x:,.1f} s"
    if a >= 0.9995:
        return f"{x:.2f} s"
    if a >= 0.09995:
        return f"{x:.3f} s"
    return f"{x * 1e3:.3g} ms"


def fmt_rate(x: float | None) -> str:
    """Tokens per second with thousands separators."""
    if x is None:
        return "—"
    if not _finite(x):
        return "∞"
    return f"{x:,.0f} tok/s" if abs(x) >= 100 else f"{x:,.2f} tok/s"


def fmt_dev(x: float | None) -> str:
    """A deviation: exact zero stays '0' (that is the bitwise case), otherwise 3 significant digits."""
    if x is None:
        return "—"
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if not _finite(x):
        return "∞"
    return "0" if x == 0 else f"{x:.3g}"


def fmt_pct(x: float | None) -> str:
    if x is None or not _finite(x):
        return "—"
    return f"{100 * x:.1f} %"


def fmt_step(x: int | None) -> str:
    return "—" if x is None else str(x)


# --- verdicts --------------------------------------------------------------------------------------


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


def _digest_text(fid: dict[str, Any]) -> str:
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


def _mean_mttr(analysis: dict[str, Any]) -> float | None:
    values = [i["mttr_s"] for i in analysis.get("mttr") or [] if i.get("mttr_s") is not None]
    return sum(values) / len(values) if values else None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


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
        what = f"after {_plural(len(faulted.get('faults') or []), 'injected fault')}"
        if kinds:
            what += f" ({', '.join(kinds)})"
        what += f" and {_plural(int(faulted.get('restarts') or 0), 'resume')}"
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
        mttr = _mean_mttr(faulted)
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


# --- the block model -------------------------------------------------------------------------------


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str
    """Inline markup: **bold** and `code` only."""


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]


@dataclass
class Image:
    caption: str
    path: Path


Block = Heading | Para | Table | Image


def _kv_table(rows: Iterable[tuple[str, str]]) -> Table:
    return Table(["measure", "value"], [[k, v] for k, v in rows])


def _fidelity_blocks(analysis: dict[str, Any], margin: float, floor: dict[str, Any]) -> list[Block]:
    fid = analysis.get("fidelity")
    if fid is None:
        return []
    missing = fid.get("missing_steps") or []
    compared = fid.get("steps_compared", 0)
    rows = [
        ("verdict", run_verdict(analysis)),
        (
            "steps compared",
            f"{compared} of {compared + len(missing)}" + (f" ({len(missing)} missing)" if missing else ""),
        ),
        ("first divergent step (bitwise)", fmt_step(fid.get("first_divergent_step"))),
        (f"first violation ({margin:g} × floor)", fmt_step(analysis.get("first_violation_step"))),
        ("fraction bitwise equal", fmt_pct(fid.get("fraction_bitwise_equal"))),
        ("max |Δloss|", fmt_dev(fid.get("max_dloss"))),
        ("mean |Δloss|", fmt_dev(fid.get("mean_dloss"))),
        ("max |Δgrad norm|", fmt_dev(fid.get("max_dgrad_norm"))),
        ("parameter digests", _digest_text(fid)),
        ("layout changed on resume", "yes" if fid.get("layout_changed") else "no"),
        (
            "floor",
            f"{analysis.get('floor_source', 'measured')}, bitwise"
            if floor.get("bitwise")
            else analysis.get("floor_source", "measured"),
        ),
    ]
    blocks: list[Block] = [Heading(4, "Fidelity"), _kv_table(rows)]
    windows = fid.get("windows") or []
    if windows:
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
                        str(w.get("resumed_at")),
                        str(w.get("steps")),
                        fmt_dev(w.get("max_dloss")),
                        fmt_dev(w.get("mean_dloss")),
                        fmt_dev(w.get("max_dgrad_norm")),
                        "yes" if w.get("layout_changed") else "no",
                    ]
                    for w in windows
                ],
            )
        )
    return blocks


def _goodput_blocks(analysis: dict[str, Any]) -> list[Block]:
    gp = analysis.get("goodput")
    if not gp:
        return []
    plain, correct = gp.get("plain_tokens_per_s") or 0.0, gp.get("correct_tokens_per_s") or 0.0
    rows = [
        ("wall clock (all attempts)", fmt_seconds(gp.get("wall_s"))),
        ("steps (correct / final trajectory)", f"{gp.get('correct_steps')} / {gp.get('steps')}"),
        ("tokens per step", f"{gp.get('tokens_per_step', 0):,}"),
        ("plain goodput", fmt_rate(plain)),
        ("correct goodput", fmt_rate(correct)),
        ("correct / plain", fmt_pct(correct / plain) if plain else "—"),
        ("useful training time", fmt_seconds(gp.get("useful_s"))),
    ]
    wall = gp.get("wall_s") or 0.0
    buckets = gp.get("badput_s") or {}
    names = [k for k in BADPUT_ORDER if k in buckets] + [k for k in buckets if k not in BADPUT_ORDER]
    bad_rows = [
        [k.replace("_", " "), fmt_seconds(buckets[k]), fmt_pct(buckets[k] / wall) if wall else "—"]
        for k in names
    ]
    bad_rows.append(
        [
            "useful (kept, correct steps)",
            fmt_seconds(gp.get("useful_s")),
            fmt_pct((gp.get("useful_s") or 0) / wall) if wall else "—",
        ]
    )
    total = sum(buckets.values()) + (gp.get("useful_s") or 0.0)
    bad_rows.append(["**total**", fmt_seconds(total), fmt_pct(total / wall) if wall else "—"])
    return [
        Heading(4, "Goodput"),
        _kv_table(rows),
        Heading(4, "Badput"),
        Table(["bucket", "seconds", "% of wall"], bad_rows),
    ]


def _mttr_blocks(analysis: dict[str, Any]) -> list[Block]:
    incidents = analysis.get("mttr") or []
    if not incidents:
        return []
    rows = []
    for n, inc in enumerate(incidents, 1):
        phases = inc.get("phases_s") or {}
        rows.append(
            [str(n), str(inc.get("kind")), str(inc.get("pre_fault_step"))]
            + [fmt_seconds(phases.get(p)) for p in PHASES]
            + [fmt_seconds(inc.get("mttr_s")), fmt_seconds(inc.get("regain_s"))]
        )
    return [
        Heading(4, "Time to recovery"),
        Para(
            "Per injected fault: fault → detected → all ranks down → relaunched → restored → first new step "
            "(MTTR), and fault → the pre-fault step reached again (regain). — = the run never got there."
        ),
        Table(
            [
                "#",
                "kind",
                "pre-fault step",
                "detect",
                "teardown",
                "relaunch",
                "start + restore",
                "first step",
                "MTTR",
                "regain",
            ],
            rows,
        ),
    ]


def _checkpoint_row(name: str, analysis: dict[str, Any]) -> list[str]:
    ck = analysis.get("checkpoint") or {}
    return [
        f"`{name}`",
        str(ck.get("saves", 0)),
        fmt_seconds(ck.get("mean_blocking_s")),
        fmt_pct(ck.get("amortized_blocking_fraction")),
    ]


def _ordered_runs(summary: dict[str, Any]) -> list[str]:
    names = list(summary.get("runs", {}))
    first = [n for n in ("reference", "floor", "faulted") if n in names]
    ablation = [c["run"] for c in summary.get("ablation") or [] if c.get("run") in names]
    return (
        first
        + [n for n in names if n.startswith("ablation-") and n not in ablation]
        + ablation
        + [n for n in names if n not in first and not n.startswith("ablation-")]
    )


def build_blocks(summary: dict[str, Any], images: dict[str, list[Any]], out: Path) -> list[Block]:
    """The whole report; `images` is make_plots' result (run name -> [Image], 'floor-band', 'ablation',
    'notes')."""
    runs = summary.get("runs", {})
    floor = summary.get("floor") or {}
    margin = summary.get("margin", 2.0)
    blocks: list[Block] = [
        Heading(1, "truestep experiment report"),
        Para(f"Experiment directory: `{out}`"),
        Heading(2, "Verdict"),
        Para(verdict_paragraph(summary)),
        Heading(2, "Floor"),
        Para(
            "The floor is the deviation between two failure-free runs with the same seed (reference and floor): "
            "the noise the platform itself makes. A step is correct while |Δloss| ≤ margin × floor and "
            "|Δgrad norm| ≤ margin × floor."
            + (
                " Here the floor is exactly zero: correct means bitwise equal."
                if floor.get("bitwise")
                else ""
            )
        ),
        _kv_table(
            [
                ("max |Δloss| (floor)", fmt_dev(floor.get("max_dloss"))),
                ("max |Δgrad norm| (floor)", fmt_dev(floor.get("max_dgrad_norm"))),
                ("bitwise identical", "yes" if floor.get("bitwise") else "no"),
                ("margin", f"{margin:g}"),
                (
                    "threshold |Δloss|",
                    fmt_dev(margin * floor["max_dloss"]) if _finite(floor.get("max_dloss")) else "—",
                ),
                (
                    "threshold |Δgrad norm|",
                    fmt_dev(margin * floor["max_dgrad_norm"])
                    if _finite(floor.get("max_dgrad_norm"))
                    else "—",
                ),
            ]
        ),
    ]
    blocks += images.get("floor-band", [])
    order = _ordered_runs(summary)
    blocks += [Heading(2, "Runs")]
    blocks.append(
        Table(
            [
                "run",
                "faults",
                "resumes",
                "verdict",
                "first divergent",
                "first violation",
                "bitwise",
                "plain goodput",
                "correct goodput",
                "mean MTTR",
            ],
            [
                [
                    f"`{name}`",
                    str(len(runs[name].get("faults") or [])),
                    str(runs[name].get("restarts", 0)),
                    run_verdict(runs[name]),
                    fmt_step((runs[name].get("fidelity") or {}).get("first_divergent_step")),
                    fmt_step(runs[name].get("first_violation_step")),
                    fmt_pct((runs[name].get("fidelity") or {}).get("fraction_bitwise_equal")),
                    fmt_rate((runs[name].get("goodput") or {}).get("plain_tokens_per_s")),
                    fmt_rate((runs[name].get("goodput") or {}).get("correct_tokens_per_s")),
                    fmt_seconds(_mean_mttr(runs[name])),
                ]
                for name in order
            ],
        )
    )
    for name in order:
        analysis = runs[name]
        blocks.append(Heading(3, f"Run `{name}`"))
        faults = analysis.get("faults") or []
        text = f"Directory `{analysis.get('path', '')}`. "
        text += f"Faults: {', '.join(f'`{f}`' for f in faults)}. " if faults else "No faults injected. "
        text += f"Resumes: {analysis.get('restarts', 0)}. "
        if name == "reference":
            text += "This is the reference every other run is compared with."
        elif name == "floor":
            text += "Same seed, no faults: its deviation from the reference is the floor."
        else:
            text += f"Verdict: **{run_verdict(analysis)}**."
        blocks.append(Para(text))
        if name != "reference":
            blocks += _fidelity_blocks(analysis, margin, floor)
        blocks += _goodput_blocks(analysis)
        blocks += _mttr_blocks(analysis)
        blocks += images.get(name, [])
    blocks += [
        Heading(2, "Checkpoint overhead"),
        Para(
            "Blocking time of each save (the training loop waits for it) and its share of step time + blocking time."
        ),
        Table(
            ["run", "saves", "mean blocking", "share of training time"],
            [_checkpoint_row(n, runs[n]) for n in order],
        ),
    ]
    cells = summary.get("ablation") or []
    if cells:
        blocks += _ablation_blocks(cells)
        blocks += images.get("ablation", [])
    notes = images.get("notes")
    if notes:
        blocks += [Heading(2, "Notes"), Para("; ".join(str(n) for n in notes))]
    return blocks


def _ablation_blocks(cells: list[dict[str, Any]]) -> list[Block]:
    rows = list(dict.fromkeys(c["row"] for c in cells))
    modes = list(dict.fromkeys(c["mode"] for c in cells))
    by = {(c["row"], c["mode"]): c for c in cells}

    def cell(c: dict[str, Any] | None) -> str:
        if c is None:
            return "not run"
        if c.get("flagged"):
            return f"**FLAGGED** (diverged at {fmt_step(c.get('first_divergent_step'))}, violation at {fmt_step(c.get('first_violation_step'))})"
        div = c.get("first_divergent_step")
        return "ok (bitwise)" if div is None else f"ok (within floor; first difference at {div})"

    return [
        Heading(2, "Ablation"),
        Para(
            "Each row switches one recovery mechanism off; each mode recovers from a graceful preemption or a "
            "hard failure. A cell is flagged when its run leaves the floor band. A correct instrument flags "
            "the rows whose mechanism matters and never the all-on row."
        ),
        Table(["row", *modes], [[f"`{r}`", *[cell(by.get((r, m))) for m in modes]] for r in rows]),
        Table(
            [
                "row",
                "mode",
                "flagged",
                "first divergent",
                "first violation",
                "plain goodput",
                "correct goodput",
            ],
            [
                [
                    f"`{c['row']}`",
                    c["mode"],
                    "**yes**" if c.get("flagged") else "no",
                    fmt_step(c.get("first_divergent_step")),
                    fmt_step(c.get("first_violation_step")),
                    fmt_rate(c.get("plain_tokens_per_s")),
                    fmt_rate(c.get("correct_tokens_per_s")),
                ]
                for c in cells
            ],
        ),
    ]


# --- rendering -------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(blocks: list[Block], base: Path) -> str:
    lines: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            lines += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Para):
            lines += [b.text, ""]
        elif isinstance(b, Table):
            lines.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
            lines.append("|" + "|".join("---" for _ in b.headers) + "|")
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            lines.append("")
        elif isinstance(b, Image):
            try:
                rel = b.path.relative_to(base).as_posix()
            except ValueError:
                rel = b.path.as_posix()
            lines += [f"![{b.caption}]({rel})", ""]
    return "\n".join(lines)


_INLINE = re.compile(r"\*\*(.+?)\*\*|`(.+?)`")


def _inline_html(text: str) -> str:
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos : m.start()]))
        out.append(
            f"<strong>{_inline_html(m.group(1))}</strong>"
            if m.group(1) is not None
            else f"<code>{html.escape(m.group(2))}</code>"
        )
        pos = m.end()
    out.append(html.escape(text[pos:]))
    return "".join(out)


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #212121; line-height: 1.45; }
h1 { border-bottom: 2px solid #424242; padding-bottom: .2em; }
h2 { border-bottom: 1px solid #bdbdbd; padding-bottom: .15em; margin-top: 2em; }
h3 { margin-top: 1.8em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: .92em; }
th, td { border: 1px solid #d0d0d0; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
tr:nth-child(even) td { background: #fafafa; }
code { background: #f3f3f3; padding: 0 .25em; border-radius: 3px; font-size: .92em; }
figure { margin: 1em 0 1.6em; }
figure img { max-width: 100%; border: 1px solid #e0e0e0; }
figcaption { color: #616161; font-size: .9em; }
"""


def render_html(blocks: list[Block], title: str = "truestep experiment report") -> str:
    body: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{_inline_html(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            body.append(f"<p>{_inline_html(b.text)}</p>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{_inline_html(h)}</th>" for h in b.headers)
            rows = "".join(
                "<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in row) + "</tr>" for row in b.rows
            )
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif isinstance(b, Image):
            data = base64.b64encode(b.path.read_bytes()).decode("ascii")
            alt = html.escape(b.caption, quote=True)
            body.append(
                f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
                f"<figcaption>{_inline_html(b.caption)}</figcaption></figure>"
            )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


# --- plots -----------------------------------------------------------------------------------------


def _run_dir(out: Path, name: str, analysis: dict[str, Any]) -> Path | None:
    for candidate in (out / "runs" / name, Path(analysis.get("path", ""))):
        if (candidate / "metrics.jsonl").is_file():
            return candidate
    return None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def make_plots(out: Path, summary: dict[str, Any]) -> dict[str, list[Any]]:
    """Write OUT/plots/*.png; returns run name -> [Image], plus 'ablation', 'floor-band' and
    'notes' (plots that could not be drawn, and why)."""
    from truestep.analysis import plots  # matplotlib is imported only when a report is made

    plot_dir = out / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    runs = summary.get("runs", {})
    floor = summary.get("floor") or {}
    margin = summary.get("margin", 2.0)
    floor_value = floor.get("max_dloss") if _finite(floor.get("max_dloss")) else 0.0
    images: dict[str, list[Any]] = {"notes": []}
    logs: dict[str, RunLog] = {}
    for name, analysis in runs.items():
        where = _run_dir(out, name, analysis)
        if where is None:
            images["notes"].append(f"run directory of `{name}` not found: no plots for it")
            continue
        logs[name] = RunLog.load(where)
    ref = logs.get("reference")

    def attempt(key: str, caption: str, draw: Any) -> None:
        try:
            images.setdefault(key, []).append(Image(caption, draw()))
        except Exception as err:  # a figure must never cost the whole report
            warnings.warn(f"plot '{caption}' failed: {err!r}", stacklevel=2)
            images["notes"].append(f"plot '{caption}' failed: {type(err).__name__}: {err}")

    for name in _ordered_runs(summary):
        run, analysis = logs.get(name), runs[name]
        if run is None or name == "reference":
            continue
        fid = analysis.get("fidelity") or {}
        violation = analysis.get("first_violation_step")
        stem = _safe(name)
        if ref is not None:
            key = "floor-band" if name == "floor" else name
            if name != "floor":
                attempt(
                    key,
                    f"Loss of `{name}` against the reference (faint x: steps later redone)",
                    lambda run=run, stem=stem, name=name: plots.plot_loss(
                        ref, run, plot_dir / f"loss-{stem}.png", f"loss: {name} vs reference"
                    ),
                )
            attempt(
                key,
                f"|Δloss| of `{name}` against the reference (0 = bitwise equal, drawn at the bottom)",
                lambda run=run, stem=stem, name=name, violation=violation, fid=fid: plots.plot_deviation(
                    ref,
                    run,
                    floor_value,
                    margin,
                    plot_dir / f"deviation-{stem}.png",
                    title=f"deviation from the reference: {name}",
                    violation=violation,
                    divergent=fid.get("first_divergent_step"),
                ),
            )
        if name != "floor":
            attempt(
                name,
                f"Wall-clock timeline of `{name}`",
                lambda run=run, stem=stem, name=name, violation=violation: plots.plot_timeline(
                    run, plot_dir / f"timeline-{stem}.png", violation=violation, title=f"timeline: {name}"
                ),
            )
    if summary.get("ablation"):
        attempt(
            "ablation",
            "Ablation: plain vs correct goodput per cell (flagged cells marked)",
            lambda: plots.plot_ablation(summary, plot_dir / "ablation.png"),
        )
    return images


# --- entry points ----------------------------------------------------------------------------------


def write_report(out: Path | str, summary: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Write OUT/plots/*.png, OUT/report.md and the self-contained OUT/report.html; returns (md, html)."""
    out = Path(out)
    if summary is None:
        summary = json.loads((out / "summary.json").read_text())
    images = make_plots(out, summary)
    blocks = build_blocks(summary, images, out)
    md_path, html_path = out / "report.md", out / "report.html"
    md_path.write_text(render_markdown(blocks, out), encoding="utf-8")
    html_path.write_text(render_html(blocks), encoding="utf-8")
    return md_path, html_path


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
            f"max |Δgrad norm| {fmt_dev(fid.get('max_dgrad_norm'))}; {_digest_text(fid)}"
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
            f"{_plural(int(ck.get('saves', 0)), 'save')}, mean blocking {fmt_seconds(ck.get('mean_blocking_s'))}, "
            f"{fmt_pct(ck.get('amortized_blocking_fraction'))} of training time",
        )
    return "\n".join(lines)
