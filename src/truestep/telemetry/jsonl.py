"""Append-only JSON-lines logs with wall-clock and monotonic timestamps.

Every record is one O_APPEND write of a whole line (never through a symlink: core/fsio.py), flushed as
it is written, so a killed process leaves whole lines behind and concurrent writers (the supervisor
and rank 0) never interleave within a line; readers (`read_jsonl`) skip only a torn final line.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from truestep.core.fsio import make_dir, open_append


class JsonlWriter:
    def __init__(self, path: Path, static: dict[str, Any] | None = None) -> None:
        make_dir(path.parent)
        self.path = path
        self.static = dict(static or {})
        self._fd: int | None = open_append(path)

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        line = {"time": time.time(), "mono": time.monotonic(), **self.static, **record}
        if self._fd is not None:
            try:
                os.write(self._fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())
            except OSError as err:  # os.write names no file: say which log (a full disk is said by where)
                raise OSError(err.errno, err.strerror, str(self.path)) from err
        return line

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Every record, streamed (memory bounded by one line): a torn final line is skipped, a corrupt
    line elsewhere raises ValueError, a line that is not an object is skipped."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        held_error: str | None = None
        for number, text in enumerate(f, 1):
            if held_error is not None:
                raise ValueError(held_error)
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as err:
                held_error = f"{path}:{number}: corrupt JSON line: {err}"
                continue
            if isinstance(record, dict):
                yield record


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All complete records; a torn last line (process killed mid-write) is dropped, nothing else is."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if index == len(lines) - 1:
                break
            raise ValueError(f"{path}:{index + 1}: corrupt JSON line: {err}") from err
    return records
