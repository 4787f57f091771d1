"""The built-in demo corpus: the Python standard library's own source, tokenized bytewise.

It is real text, present on every machine with Python, and needs no download, so `data.path = ""`
works offline. It is a demo: different Python versions give different corpora, hence the versioned
cache directory.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import sysconfig
import uuid
from pathlib import Path

from truestep.core.launch import cache_root
from truestep.data.errors import DataError
from truestep.data.meta import verify_data_dir
from truestep.data.shards import is_replaceable_dir, prepare_data

DEMO_MAX_BYTES = 4 * 1024 * 1024
DEMO_MIN_BYTES = 64 * 1024  # below this the install has no usable sources (e.g. .pyc-only builds)


def demo_corpus_files(max_bytes: int = DEMO_MAX_BYTES) -> list[Path]:
    """Top-level stdlib `.py` files, sorted by name, UTF-8 only, until `max_bytes` would be exceeded.

    Stopping at the first file that does not fit (rather than skipping it) keeps the corpus a
    prefix of the sorted list, which is easier to reason about.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    total = 0
    for path in sorted(stdlib.glob("*.py"), key=lambda p: p.name):
        if not path.is_file():
            continue
        try:
            data = path.read_bytes()
            data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if total + len(data) > max_bytes:
            break
        files.append(path)
        total += len(data)
    if total < DEMO_MIN_BYTES:
        raise DataError(
            f"the demo corpus needs the standard library's .py sources, but {stdlib} has only "
            f"{total} bytes of them; set data.path to a directory made by `truestep prepare-data`"
        )
    return files


def default_demo_dir() -> Path:
    """`$TRUESTEP_CACHE/demo-<python version>`, or under ~/.cache/truestep when unset."""
    root = cache_root()
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "truestep"
    return base / f"demo-{platform.python_version()}"


def check_private_dir(directory: Path) -> None:
    """DataError unless `directory` (if it exists) can be written only by this user (or root): a cache
    in a directory others may write (a shared /tmp subdirectory, a group-writable project space) could
    be given a planted corpus that verifies against its own planted hashes, and every run would train
    on it. Set TRUESTEP_CACHE to a directory of your own."""
    try:
        st = directory.stat()
    except FileNotFoundError:
        return
    others_write = st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_uid != os.geteuid())
    if others_write or st.st_uid not in (os.geteuid(), 0):
        raise DataError(
            f"the demo corpus cache {directory} can be written by other users (mode "
            f"{st.st_mode & 0o7777:04o}, owner uid {st.st_uid}); refusing to use it: set TRUESTEP_CACHE "
            "to a directory only you can write"
        )


def _is_valid(data_dir: Path) -> bool:
    try:
        meta = verify_data_dir(data_dir, check_hashes=True)
    except DataError:
        return False
    return meta.get("tokenizer") == "byte"


def ensure_demo_data(cache_dir: Path | None = None) -> Path:
    """Prepare the demo corpus once into `cache_dir` and return it; reuse it if it verifies.

    Safe when many processes (e.g. every rank of a job) call it at once: an exclusive lock file
    serializes the builders, and the data is built in a temp directory and renamed into place, so a
    reader never sees a half-written directory.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_demo_dir()
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    for directory in (cache_dir.parent, cache_dir):
        check_private_dir(directory)
    if _is_valid(cache_dir):
        return cache_dir
    lock_path = cache_dir.with_name(cache_dir.name + ".lock")
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            # Another process may have finished the build while we waited for the lock.
            if _is_valid(cache_dir):
                return cache_dir
            if cache_dir.exists() and not (cache_dir.is_dir() and is_replaceable_dir(cache_dir)):
                # Never delete something that is not a truestep data dir (e.g. a mistyped path).
                raise DataError(f"{cache_dir} exists and is not a truestep data directory; not replacing it")
            tmp = cache_dir.with_name(f".{cache_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                prepare_data(demo_corpus_files(), tmp, tokenizer_spec="byte")
                if cache_dir.exists():
                    # Stale or corrupt: move it aside, since rename cannot replace a non-empty dir.
                    trash = tmp.with_name(tmp.name + ".old")
                    os.rename(cache_dir, trash)
                    shutil.rmtree(trash, ignore_errors=True)
                try:
                    os.rename(tmp, cache_dir)
                except OSError:
                    # Only reachable where flock is not honoured (some network filesystems):
                    # another process renamed its copy first, and that copy is as good as ours.
                    if not _is_valid(cache_dir):
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    if not _is_valid(cache_dir):
        raise DataError(f"demo data in {cache_dir} failed verification right after it was built")
    return cache_dir
