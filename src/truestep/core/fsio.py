"""Durable, symlink-refusing file I/O for everything truestep writes into a run directory.

Anyone who can write a shared run directory could plant a symlink (`config.toml -> ~/.bashrc`) and make
the training user overwrite the target. So writes never follow a symlink: replacements are a fresh
temp file (O_EXCL, random name) renamed over the destination (a rename replaces a link, never its
target), and appends open with O_NOFOLLOW. Durability: fsync the file, then its directory.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from truestep.core.errors import RefusedError

CHUNK = 8 << 20


class UnsafePathError(OSError):
    """A path truestep was about to write through is a symlink or not a regular file."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Replace `path` with `data` all at once: readers see the old or the new file, never a torn one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def open_append(path: Path) -> int:
    """An O_APPEND descriptor for `path` (created 0644 if missing); refuses a symlink or a non-file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafePathError(errno.ELOOP, "refusing to append through a symlink", str(path)) from None
        raise
    if not _is_regular(fd):
        os.close(fd)
        raise UnsafePathError(errno.EINVAL, "refusing to append to something that is not a file", str(path))
    return fd


def append_bytes(path: Path, data: bytes) -> None:
    """One O_APPEND write (whole lines stay whole across concurrent appenders)."""
    fd = open_append(path)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def make_dir(path: Path) -> None:
    """mkdir -p that refuses to create inside, or accept as the directory, a symlink."""
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        raise UnsafePathError(errno.ELOOP, "refusing a directory that is a symlink", str(path))


def new_staging_dir(path: Path, what: str) -> Path:
    """A fresh staging directory beside `path`, to be published with `publish_dir`; `path` itself must
    not exist or be an empty directory (RefusedError otherwise: never overwrite `what`)."""
    if path.is_symlink() or (path.exists() and (not path.is_dir() or any(path.iterdir()))):
        raise RefusedError(
            f"{path} already exists and is not an empty directory; refusing to overwrite {what}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))


def publish_dir(staging: Path, path: Path) -> None:
    """Move a finished staging directory into place (a single rename)."""
    umask = os.umask(0)
    os.umask(umask)
    for item in staging.iterdir():  # some writers create 0600 files; give them the usual mode
        item.chmod(0o666 & ~umask)
    staging.chmod(0o777 & ~umask)
    if path.is_dir() and not path.is_symlink():
        path.rmdir()  # empty, checked by new_staging_dir
    os.replace(staging, path)
    fsync_dir(path.parent)
