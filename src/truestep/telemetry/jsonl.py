"""Append-only JSON-lines logs with wall-clock and monotonic timestamps.

Every record is one O_APPEND write of a whole line (never through a symlink: core/fsio.py), flushed as
it is written, so a killed process leaves whole lines behind and concurrent writers (the supervisor
and rank 0) never interleave within a line; readers (`read_jsonl`) skip only a torn final line.

The resume reads its own logs back (`iter_jsonl`: the restored step's witness and digest in events.jsonl,
the pre-fault steps in metrics.jsonl), and anyone who can write the run directory can put anything in
them: a 16 GiB file, a line of garbage or of deeply nested JSON, a line without its end (a full disk).
A log is narrative, not an authority, so that reader is bounded and tolerant: it reads at most the last
TAIL_LIMIT bytes (only the latest records matter there), at most LINE_LIMIT bytes of one line, never
through a symlink or from a FIFO or device (refused: `LogFileError`, exit 3), and skips every line that
is not a JSON object within those bounds, counting them and saying so in one line. It never raises for
what a line holds, so a bad line can neither crash a rank nor send the job into a requeue loop.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from truestep.core.errors import RefusedError
from truestep.core.fsio import UnsafePathError, make_dir, open_append, open_regular
from truestep.core.outside import OutsideJsonError, loads_bounded

LINE_LIMIT = 1 << 20
"""A record is a few hundred bytes (a run_start with its resolved config a few KB): a longer line is not
one of ours, and is skipped without being held in memory."""
TAIL_LIMIT = 256 << 20
"""How much of the end of a log `iter_jsonl` reads (the resume wants its latest records: about a million
steps of metrics); a longer file is read from there, and that is said."""
SKIP_CHUNK = 1 << 16


class LogFileError(RefusedError, ValueError):
    """A log is not a regular file (a symlink, a FIFO, a device): refused, never read."""


def _ends_torn(path: Path) -> bool:
    """`path` (a regular file: just opened for appending) is not empty and does not end with a line end."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        return size > 0 and os.pread(fd, 1, size - 1) != b"\n"
    finally:
        os.close(fd)


def _say(line: str) -> None:
    print(f"truestep: {line}", file=sys.stderr, flush=True)


class JsonlWriter:
    def __init__(self, path: Path, static: dict[str, Any] | None = None) -> None:
        make_dir(path.parent)
        self.path = path
        self.static = dict(static or {})
        self._fd: int | None = open_append(path)
        if _ends_torn(path):  # a kill or a full disk cut the last line: end it, do not extend it
            os.write(self._fd, b"\n")

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


def iter_jsonl(
    path: Path,
    say: Callable[[str], None] | None = None,
    line_limit: int = LINE_LIMIT,
    tail_limit: int = TAIL_LIMIT,
) -> Iterator[dict[str, Any]]:
    """Every record among the last `tail_limit` bytes of a log, streamed, in bounded memory; nothing when
    it does not exist. A line that is not a JSON object within bounds (over `line_limit` bytes, not
    UTF-8, not JSON, nested too deeply) is skipped and counted, said once through `say` (default: one
    line on stderr) when the reading ends; a last line without its end (a kill, a full disk) is skipped
    quietly. LogFileError (exit 3) when the log is not a regular file."""
    say = say or _say
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return
    except UnsafePathError as err:
        raise LogFileError(f"{path}: {err.strerror}: refusing to read it as a log") from None
    skipped: Counter[str] = Counter()
    first = ""
    try:
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > tail_limit:
                say(f"{path} is {size} bytes: reading only its last {tail_limit} (the latest records)")
                f.seek(size - tail_limit)
                _skip_line(f)  # the line the cut fell in
            while raw := f.readline(line_limit + 1):
                if not raw.endswith(b"\n"):
                    if len(raw) <= line_limit:
                        break  # the torn last line
                    _skip_line(f)
                    kind, reason = "too long", f"a line longer than {line_limit} bytes"
                else:
                    try:
                        record = loads_bounded(raw, "line", allow_nan=True)  # a NaN loss is logged as NaN
                    except OutsideJsonError as err:
                        reason = str(err).removeprefix("line: not valid JSON: ")
                        kind = reason.split(":")[0]
                    else:
                        if isinstance(record, dict):
                            yield record
                        continue
                skipped[kind] += 1
                first = first or reason
    finally:
        if skipped:
            kinds = ", ".join(f"{n} {kind}" for kind, n in skipped.items())
            say(f"{path}: skipped {sum(skipped.values())} unreadable line(s) ({kinds}); the first: {first}")


def _skip_line(f: IO[bytes]) -> None:
    """Read on to the end of the current line, SKIP_CHUNK bytes at a time."""
    while (part := f.readline(SKIP_CHUNK)) and not part.endswith(b"\n"):
        pass


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
