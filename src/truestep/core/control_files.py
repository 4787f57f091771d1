"""Bounded, no-follow reads of the run directory's control files (lease, heartbeats, attempt configs,
the events log at resume).

Anyone who can write a shared run directory can put anything where a control file is expected: a FIFO
(an unbounded blocking read: the supervisor would never notice a killed rank), a symlink to /dev/zero
(memory exhausted), a 16 GiB sparse file, or a file of the right name with the wrong content. Every
control file is therefore read here, through `fsio.read_regular` (no symlink followed, no FIFO or device
opened for reading, a size bound checked before the read), and parsed into a JSON object whose fields
the caller then checks by type. Anything else is one `ControlFileError` naming the file and what is
wrong with it: the caller refuses in one line or ignores the file and says so, never hangs or raises a
traceback. Standard library only (a rank reads its launch files before torch is imported).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from truestep.core.fsio import OversizeFileError, UnsafePathError, open_regular, read_regular

CONTROL_JSON_LIMIT = 64 << 10
"""A lease or heartbeat is a few hundred bytes; anything over 64 KiB is not one."""
EVENTS_TAIL_BYTES = 4 << 20
"""How much of the end of events.jsonl is scanned at resume (records there are a few hundred bytes)."""


class ControlFileError(ValueError):
    """A control file is not a regular file of sane size holding what its kind holds (one line)."""


def read_control_bytes(path: Path, limit: int) -> bytes | None:
    """The bytes of a control file; None when it does not exist; ControlFileError for a symlink, FIFO,
    device, directory or a file over `limit` bytes (nothing of it read)."""
    try:
        return read_regular(path, limit)
    except FileNotFoundError:
        return None
    except (UnsafePathError, OversizeFileError) as err:
        raise ControlFileError(f"{path}: {_one_line(err)}") from None
    except OSError as err:
        raise ControlFileError(f"{path}: cannot be read ({err.strerror or err})") from None


def read_control_json(path: Path, limit: int = CONTROL_JSON_LIMIT) -> dict[str, Any] | None:
    """A control file's JSON object; None when the file does not exist; ControlFileError otherwise
    when it cannot be one (see `read_control_bytes`, plus: not UTF-8 JSON, not an object)."""
    raw = read_control_bytes(path, limit)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ControlFileError(f"{path}: not JSON ({_one_line(err)})") from None
    if not isinstance(data, dict):
        raise ControlFileError(f"{path}: not a JSON object")
    return data


def require(data: dict[str, Any], path: Path, key: str, kind: type | tuple[type, ...]) -> Any:
    """`data[key]` when it has type `kind` (a bool is not an int here; a float must be finite), else
    ControlFileError naming the file and the key."""
    value = data.get(key)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if ok and isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        wanted = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise ControlFileError(f"{path}: field {key!r} is {value!r:.60}, not {wanted}")
    return value


def read_log_tail(path: Path, tail_bytes: int = EVENTS_TAIL_BYTES) -> list[bytes]:
    """The complete lines among the last `tail_bytes` of an append-only log (no symlink followed, no
    FIFO or device opened); [] when it does not exist; ControlFileError when it is not a regular file.
    A log longer than that is read from its tail, so a huge (or sparse) file costs no more."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return []
    except (UnsafePathError, OSError) as err:
        raise ControlFileError(f"{path}: {_one_line(err)}") from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = max(0, size - tail_bytes)
        f.seek(start)
        data = f.read(tail_bytes)
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first is (probably) the end of a line cut by the seek
    return [line for line in lines if line.strip()]


def _one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return " ".join(str(err).split())
