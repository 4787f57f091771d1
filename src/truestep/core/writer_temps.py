"""Temp files of atomic writes, named after their writer, so that the next writer of a path removes what
a dead one left beside it.

`fsio.atomic_write` writes `.NAME.<tag>-<pid>.<random>.tmp` beside NAME, then renames it over NAME. A
writer killed in between (SIGKILL, OOM, a node going down) leaves that temp behind, and nobody may
remove a temp blindly: a live writer's looks the same. So the name says whose it is: `tag` is this host
and PID namespace, `pid` the writing process. The first time a process writes a path, it removes every
temp of that path whose writer ran here and no longer exists. A temp of another host or PID namespace,
or of a pid that is alive (or was reused since), is left alone: never a live writer's.

Cost: one listing of the directory per path and process (the first write), which is one or two metadata
requests even in a directory of thousands of entries (a heartbeat directory, a checkpoint's rank files).
Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
from pathlib import Path

_SWEPT: set[str] = set()
"""Paths this process has already cleaned beside (the first write of each)."""
_LOCK = threading.Lock()


def _namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:  # no /proc (macOS): the host name alone
        return ""


WRITER_TAG = hashlib.sha256(f"{socket.gethostname()}\0{_namespace()}".encode()).hexdigest()[:8]
"""This host and PID namespace: a pid means a process only where the tag is the same."""


def temp_prefix(path: Path) -> str:
    """The prefix of this process's temp files for `path` (mkstemp adds the random part)."""
    return f".{path.name}.{WRITER_TAG}-{os.getpid()}."


def temp_writer(name: str, path: Path) -> tuple[str, int] | None:
    """(tag, pid) of the writer of `name` if it is a temp file of `path` named by `temp_prefix`."""
    pattern = rf"\.{re.escape(path.name)}\.([0-9a-f]{{8}})-(\d+)\.[A-Za-z0-9_]+\.tmp"
    match = re.fullmatch(pattern, name)
    return (match.group(1), int(match.group(2))) if match else None


def alive(pid: int) -> bool:
    """Whether a process with this pid exists here (another user's counts: it is alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:  # not a pid this system can have
        return False
    return True


def sweep_dead_temps(path: Path) -> list[Path]:
    """Once per process and path: remove the temp files of `path` that a writer of this host left when
    it died. Returns what was removed. Errors of the listing or a removal leave the files (the write
    itself goes on: a leftover temp is litter, not a failure of the write)."""
    key = str(path)
    with _LOCK:
        if key in _SWEPT:
            return []
        _SWEPT.add(key)
    removed = []
    try:
        with os.scandir(path.parent) as entries:
            names = [entry.name for entry in entries]
    except OSError:
        return removed
    for name in names:
        writer = temp_writer(name, path)
        if writer is None or writer[0] != WRITER_TAG or writer[1] == os.getpid() or alive(writer[1]):
            continue
        try:
            os.unlink(path.parent / name)  # a name, never followed: removes a link, not its target
        except OSError:  # gone already (another writer of this path swept it), or not ours to remove
            continue
        removed.append(path.parent / name)
    return removed
