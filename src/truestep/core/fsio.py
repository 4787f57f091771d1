"""Durable, symlink-refusing file I/O for everything truestep writes into a run directory, and bounded,
hang-proof reads of files that came from someone else.

Anyone who can write a shared run directory could plant a symlink (`config.toml -> ~/.bashrc`) and make
the training user overwrite the target. So writes never follow a symlink: replacements are a fresh
temp file (O_EXCL, random name) renamed over the destination (a rename replaces a link, never its
target), appends and in-place writes open with O_NOFOLLOW, and a new file that must not replace anything
(`write_new_file`) is published with link(2), which fails if the name exists. Durability: fsync the file,
then its directory.

Reads of untrusted files open with O_NONBLOCK and check fstat before reading: a FIFO planted where a
file is expected would otherwise block the reader forever, and a device (`/dev/zero`) would never end.
`read_regular` also bounds the size, so a huge file is refused before it is read into memory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from truestep.core.errors import RefusedError, UnsafePathError  # UnsafePathError: exit 3, with the codes
from truestep.core.writer_temps import sweep_dead_temps, temp_prefix

CHUNK = 8 << 20


class OversizeFileError(ValueError):
    """A file is larger than anything of its kind can legitimately be; it was not read."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def plain_file_name(name: object) -> bool:
    """A bare file name inside one directory: a non-empty string with no `/`, not `.`/`..`, no NUL."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def plain_relative_name(name: object) -> bool:
    """A relative path that stays inside its directory: plain names joined by `/` (no absolute path,
    no `..`, `.` or empty component, no NUL)."""
    return isinstance(name, str) and bool(name) and all(plain_file_name(part) for part in name.split("/"))


def entry_kind(path: Path) -> str | None:
    """None for a regular file (never following a symlink), else what it is ("a symlink", "a FIFO", ...)."""
    mode = os.lstat(path).st_mode
    return None if stat.S_ISREG(mode) else _kind(mode)


def open_regular(
    path: Path, flags: int = os.O_RDONLY, follow_symlinks: bool = False, mode: int = 0o644
) -> int:
    """A descriptor for `path`, guaranteed to be a regular file; never blocks on a FIFO or device.

    Opened with O_NONBLOCK (a FIFO without a writer would block an open or read forever), checked with
    fstat, then switched back to blocking I/O. A symlink is refused (ELOOP) unless `follow_symlinks`.
    """
    nofollow = 0 if follow_symlinks else os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | nofollow | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_symlinks:
            raise UnsafePathError(errno.ELOOP, "refusing to open a symlink", str(path)) from None
        if err.errno == errno.ENXIO:  # O_WRONLY|O_NONBLOCK on a FIFO without a reader
            raise UnsafePathError(errno.ENXIO, "refusing to open a FIFO", str(path)) from None
        raise
    st_mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(st_mode):
        os.close(fd)
        raise UnsafePathError(errno.EINVAL, f"refusing to open {_kind(st_mode)} as a file", str(path))
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def read_regular(path: Path, limit: int, follow_symlinks: bool = False) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; UnsafePathError for a symlink (unless
    `follow_symlinks`), FIFO, device or directory, OversizeFileError (nothing read) when larger."""
    fd = open_regular(path, follow_symlinks=follow_symlinks)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise OversizeFileError(
                f"{path} is {size} bytes, more than the {limit} a file of its kind may have"
            )
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while being read
        raise OversizeFileError(f"{path} is more than the {limit} bytes a file of its kind may have")
    return data


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, durable: bool = True, mode: int = 0o644) -> None:
    """Replace `path` with `data` all at once: readers see the old or the new file, never a torn one.
    The file is created 0600 and only then given `mode`: a secret (mode 0600) is never readable by others.
    The temp file is named after its writer, and the first write of `path` by a process removes the temp
    files dead writers of `path` left (core/writer_temps.py)."""
    sweep_dead_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def replace_in_own_dir(path: Path, data: bytes) -> None:
    """`atomic_write` (not durable) for a file in a directory truestep made and keeps writing into while
    others may change the run directory (heartbeats): the directory itself is opened without following a
    symlink, and the temp file and the rename are relative to that descriptor, so a directory swapped for
    a link to elsewhere mid-run is refused (UnsafePathError), never written through."""
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(err.errno, "refusing a directory that is a symlink or not a directory",
                                  str(path.parent)) from None  # fmt: skip
        raise
    try:
        temp = f".{path.name}.{os.urandom(6).hex()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o644, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


def open_append(path: Path) -> int:
    """An O_APPEND descriptor for `path` (created 0644 if missing); refuses a symlink or a non-file."""
    return open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def open_for_write(path: Path) -> IO[bytes]:
    """`path` created or truncated for writing, never through a symlink and never a FIFO or device
    (for writers that must produce a fixed name in a directory truestep created, e.g. DCP shards)."""
    return os.fdopen(open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb")


def write_new_file(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Create `path` with what `write(file)` writes, all at once, refusing to replace anything there.

    The content goes to a fresh temp file beside `path` (fsynced), which is then hard-linked to `path`:
    link(2) fails if the name exists (a file, a directory, a symlink, even a dangling one), so an existing
    file is never overwritten and a planted symlink never followed. RefusedError if `path` exists.
    """
    if os.path.lexists(path):
        raise RefusedError(
            f"{path} already exists; refusing to overwrite it (remove it or choose another name)"
        )
    sweep_dead_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise RefusedError(
                f"{path} appeared while it was being written; refusing to overwrite it"
            ) from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    fsync_dir(path.parent)


def check_writable(directory: Path) -> None:
    """Create and remove a fresh probe file in `directory` (O_EXCL, no symlink); OSError if it cannot."""
    fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=directory)
    os.close(fd)
    os.unlink(probe)


def append_bytes(path: Path, data: bytes) -> None:
    """One O_APPEND write (whole lines stay whole across concurrent appenders)."""
    fd = open_append(path)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = open_regular(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    """SHA-256 of a regular file (a symlink, FIFO or device is refused, never opened for reading)."""
    h = hashlib.sha256()
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def make_dir(path: Path) -> None:
    """mkdir -p that refuses to create inside, or accept as the directory, a symlink or something else
    that is not a directory (UnsafePathError, exit 3)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file, a FIFO, a link to one: not the directory truestep writes into
        raise UnsafePathError(
            errno.ENOTDIR, "refusing a directory that is not a directory", str(path)
        ) from None
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
