"""Blocks to Markdown (OUT/report.md); images are linked relative to the experiment directory."""

from __future__ import annotations

from pathlib import Path

from truestep.analysis.report.blocks import Block, Heading, Image, Para, Table


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
