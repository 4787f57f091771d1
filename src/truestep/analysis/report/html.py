"""Blocks to one self-contained HTML page (OUT/report.html): CSS inline, images embedded as data URIs,
so it can be mailed or archived as one file."""

from __future__ import annotations

import base64
import html
import re

from truestep.analysis.report.blocks import Block, Heading, Image, Para, Table

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
