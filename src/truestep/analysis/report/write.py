"""The entry point that writes the report: OUT/plots/*.png, OUT/report.md and OUT/report.html."""

from __future__ import annotations

from pathlib import Path

from truestep.analysis.report.document import build_blocks
from truestep.analysis.report.figures import make_plots
from truestep.analysis.report.html import render_html
from truestep.analysis.report.markdown import render_markdown
from truestep.analysis.summary import ExperimentSummary


def write_report(out: Path | str, summary: ExperimentSummary) -> tuple[Path, Path]:
    """Write OUT/plots/*.png, OUT/report.md and the self-contained OUT/report.html; returns (md, html)."""
    out = Path(out)
    figures = make_plots(out, summary)
    blocks = build_blocks(summary, figures, out)
    md_path, html_path = out / "report.md", out / "report.html"
    md_path.write_text(render_markdown(blocks, out), encoding="utf-8")
    html_path.write_text(render_html(blocks), encoding="utf-8")
    return md_path, html_path
