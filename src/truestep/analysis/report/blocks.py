"""The block model: the report is built once as a list of blocks (heading, paragraph, table, image) and
rendered twice, to Markdown and to HTML, so both always say the same thing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


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


def kv_table(rows: Iterable[tuple[str, str]]) -> Table:
    return Table(["measure", "value"], [[k, v] for k, v in rows])
