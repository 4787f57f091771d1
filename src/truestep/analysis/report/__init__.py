"""The experiment report: OUT/report.md, a self-contained OUT/report.html and OUT/plots/*.png, all drawn
from the typed ExperimentSummary (analysis/summary.py; experiment/summary.py `summarize` makes it).

The report is built once as a list of blocks (heading, paragraph, table, image) and rendered twice, so
the Markdown and the HTML always say the same thing. The HTML embeds its images as data URIs and its
CSS inline: it can be mailed or archived as one file. Verdicts are decided in analysis/verdict.py and only
worded here.

`render_run_text` is the same content for one run as compact text, for the CLI.

Modules: format (numbers, orders, labels), opening (the verdict paragraph), blocks (the block model),
sections (floor, per-run and ablation sections), document (the whole report), markdown and html
(renderers), figures (which plots go where), plots (the matplotlib figures, imported only when a report
is made), text (the CLI text) and write (`write_report`).
"""

from __future__ import annotations

from truestep.analysis.report.blocks import Block, Heading, Image, Para, Table
from truestep.analysis.report.document import Figures, build_blocks
from truestep.analysis.report.figures import make_plots
from truestep.analysis.report.format import (
    BADPUT_ORDER,
    PHASE_LABELS,
    PHASES,
    fmt_dev,
    fmt_pct,
    fmt_rate,
    fmt_seconds,
    fmt_step,
)
from truestep.analysis.report.html import render_html
from truestep.analysis.report.markdown import render_markdown
from truestep.analysis.report.opening import verdict_paragraph
from truestep.analysis.report.text import TEXT_SECTIONS, render_run_text
from truestep.analysis.report.write import write_report

__all__ = [
    "BADPUT_ORDER",
    "PHASES",
    "PHASE_LABELS",
    "TEXT_SECTIONS",
    "Block",
    "Figures",
    "Heading",
    "Image",
    "Para",
    "Table",
    "build_blocks",
    "fmt_dev",
    "fmt_pct",
    "fmt_rate",
    "fmt_seconds",
    "fmt_step",
    "make_plots",
    "render_html",
    "render_markdown",
    "render_run_text",
    "verdict_paragraph",
    "write_report",
]
