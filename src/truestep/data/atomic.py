"""Atomic file writes: write a temp file in the target directory, fsync, then rename over the name.

A reader (or a crash) therefore sees either the old file or the complete new one, never a prefix.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np

TMP_MARK = ".tmp-"


def temp_path(final: Path) -> Path:
    """A unique hidden sibling of `final`; same directory so the rename cannot cross filesystems."""
    return final.with_name(f".{final.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def is_temp_name(name: str) -> bool:
    """True for names produced by `temp_path` (left behind only if a writer died)."""
    return name.startswith(".") and TMP_MARK in name


def fsync_dir(directory: Path) -> None:
    """Persist a rename: the directory entry lives in the directory, not in the file."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some platforms/filesystems cannot open directories; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(final: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call `write(file)` on a temp file, then atomically move it to `final`."""
    tmp = temp_path(final)
    try:
        # O_EXCL | O_NOFOLLOW: a name planted where the temp file goes is refused, never written through.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


def atomic_write_bytes(final: Path, data: bytes) -> None:
    """Atomically replace `final` with `data`."""
    atomic_write(final, lambda f: f.write(data))


class _HashingWriter:
    """File-like wrapper that hashes what passes through, so a shard is hashed without re-reading it.

    It is deliberately not a real file object: numpy then writes through `.write()` instead of
    `ndarray.tofile`, which would bypass the hash.
    """

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.hash = hashlib.sha256()

    def write(self, data: bytes | memoryview) -> int:
        self.hash.update(data)
        return self._f.write(data)


def atomic_save_npy(final: Path, arr: np.ndarray) -> str:
    """Atomically write `arr` as a .npy file (no pickle); return the sha256 of the file's bytes."""
    digest: list[str] = []

    def write(f: IO[bytes]) -> None:
        w = _HashingWriter(f)
        np.lib.format.write_array(w, np.ascontiguousarray(arr), allow_pickle=False)
        digest.append(w.hash.hexdigest())

    atomic_write(final, write)
    return digest[0]
