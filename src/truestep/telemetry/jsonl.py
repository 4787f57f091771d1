"""Append-only JSON-lines logs with wall-clock and monotonic timestamps.

Every line is flushed and fsynced-on-close so that a killed process leaves whole lines behind; readers
(`read_jsonl`) skip only a torn final line and say so.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class JsonlWriter:
    def __init__(self, path: Path, static: dict[str, Any] | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.static = dict(static or {})
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        line = {"time": time.time(), "mono": time.monotonic(), **self.static, **record}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()
        return line

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()


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
