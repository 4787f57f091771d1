"""The experiment report: OUT/report.md, a self-contained OUT/report.html and OUT/plots/*.png, all drawn
from summary.json (experiment/plan.py `summarize`) and the run directories.

The report is built once as a list of blocks (heading, paragraph, table, image) and rendered twice, so
the Markdown and the HTML always say the same thing. The HTML embeds its images as data URIs and its
CSS inline: it can be mailed or archived as one file.

`render_run_text` is the same content for one run as compact text, for the CLI.

Modules: format (numbers, orders, labels), verdict, blocks (the block model), sections (per-run and
ablation sections), document (the whole report), markdown and html (renderers), figures (which plots go
where), plots (the matplotlib figures, imported only when a report is made), text (the CLI text) and
write (`write_report`).
"""

from __future__ import annotations

from truestep.analysis.report.blocks import Block, Heading, Image, Para, Table
from truestep.analysis.report.document import build_blocks
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
from truestep.analysis.report.text import TEXT_SECTIONS, render_run_text
from truestep.analysis.report.verdict import run_verdict, verdict_paragraph
from truestep.analysis.report.write import write_report

__all__ = [
    "BADPUT_ORDER",
    "PHASES",
    "PHASE_LABELS",
    "TEXT_SECTIONS",
    "Block",
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
    "run_verdict",
    "verdict_paragraph",
    "write_report",
]
