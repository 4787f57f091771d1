"""The commit protocol's two files: the manifest (every file, size, SHA-256) and the commit marker.

Manifest version 1 holds one SHA-256 per file (rank 0 hashed every file after the write: `write_manifest`,
still used for weights-only exports and still read). Version 2 (`write_manifest_v2`, every training save)
holds, for each `.distcp` shard, the SHA-256 of every storage item (`items`: [offset, length, sha256],
covering the file exactly), hashed by the rank that wrote it while writing; only the small files
(`.metadata`, rank state) are hashed by rank 0. A reader checks an item's bytes as it reads them
(`safe_dcp`); `verify_files(..., items_on_read=True)` leaves exactly those bytes to it.

The files of a checkpoint are complete iff its marker parses, names the directory's step and the
manifest's SHA-256, and every file the manifest lists is present with its size (and checksum, when
verifying them), with no file the manifest does not list (`verify_files`). Only regular files can be
part of a checkpoint: a symlink, FIFO, socket or device anywhere inside it fails verification before
anything is opened (a FIFO would block a reader forever). What the files say about each other (DCP
metadata, rank state, step) is checked on top of this by `checkpoint/integrity.py`. The marker also
records the incarnation (job-wide attempt) that committed it: the run directory lease's fencing token.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from truestep.checkpoint.catalog import MANIFEST, MARKER, step_of
from truestep.checkpoint.hash_counters import count
from truestep.core.fsio import (
    OversizeFileError,
    UnsafePathError,
    atomic_write,
    entry_kind,
    fsync_dir,
    fsync_file,
    open_regular,
    plain_relative_name,
    read_regular,
    sha256_file,
)

MAX_JSON_BYTES = 64 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class VerifyError(Exception):
    """Why a checkpoint directory is not a complete checkpoint (short, event-log friendly)."""


def payload_files(ckpt_dir: Path) -> list[Path]:
    """Every file except the manifest and the marker, sorted by relative name; subdirectories are walked
    without following symlinks. VerifyError for anything that is not a regular file or a directory."""
    skip = {MANIFEST, MARKER}
    found: list[Path] = []
    pending = [ckpt_dir]
    while pending:
        directory = pending.pop()
        for entry in os.scandir(directory):
            path = Path(entry.path)
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                pending.append(path)
            elif not stat.S_ISREG(mode):
                kind = entry_kind(path)
                raise VerifyError(f"{path.relative_to(ckpt_dir).as_posix()} is {kind}, not a regular file")
            elif path.relative_to(ckpt_dir).as_posix() not in skip:
                found.append(path)
    return sorted(found)


def build_manifest(ckpt_dir: Path, step: int) -> dict[str, Any]:
    files = {}
    for path in payload_files(ckpt_dir):
        fsync_file(path)  # durability of every rank's files before they are declared complete
        size = path.stat().st_size
        files[path.relative_to(ckpt_dir).as_posix()] = {"size": size, "sha256": sha256_file(path)}
        count("read_back", size)
    return {"format": "truestep-manifest", "version": 1, "step": step, "files": files}


def write_manifest(ckpt_dir: Path, step: int) -> bytes:
    blob = json.dumps(build_manifest(ckpt_dir, step), indent=1, sort_keys=True).encode()
    atomic_write(ckpt_dir / MANIFEST, blob)
    return blob


def write_manifest_v2(ckpt_dir: Path, step: int, item_digests: dict[str, list[list[Any]]]) -> bytes:
    """Manifest version 2 from the writers' per-item digests: no shard is read, nor fsynced here (each
    rank fsynced its own). A file no writer hashed (`.metadata`, rank state: small) is hashed whole."""
    files: dict[str, Any] = {}
    for path in payload_files(ckpt_dir):
        name = path.relative_to(ckpt_dir).as_posix()
        size = os.lstat(path).st_size
        if name in item_digests:
            items = item_digests[name]
            _check_items(name, items, size)
            files[name] = {"size": size, "items": items}
        else:
            files[name] = {"size": size, "sha256": sha256_file(path)}
            count("read_back", size)
    fsync_dir(ckpt_dir)
    manifest = {"format": "truestep-manifest", "version": 2, "step": step, "files": files}
    blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
    atomic_write(ckpt_dir / MANIFEST, blob)
    return blob


def _check_items(name: str, items: Any, size: int) -> None:
    """`items` must be [offset, length, sha256] triples that tile the file [0, size) exactly, so no byte
    of it goes unhashed and no range is hashed twice."""
    if not isinstance(items, list) or not items:
        raise VerifyError(f"{name}: malformed item digests in the manifest")
    end = 0
    for item in items:
        ok = isinstance(item, list) and len(item) == 3
        offset, length, digest = item if ok else (None, None, None)
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (offset, length))
        if not (ok and ints and isinstance(digest, str) and _SHA256.match(digest)):
            raise VerifyError(f"{name}: malformed item digest {item!r:.80} in the manifest")
        if offset != end or length < 0:
            raise VerifyError(f"{name}: item digests do not tile the file (bytes {end}..{offset})")
        end = offset + length
    if end != size:
        raise VerifyError(f"{name}: item digests cover {end} bytes of {size}")


def _hash_items(path: Path, items: list[list[Any]]) -> str | None:
    """One sequential read of `path`, hashing each item's range; the first bad range, else None."""
    with os.fdopen(open_regular(path), "rb") as stream:
        for offset, length, digest in items:
            h = hashlib.sha256()
            left = length
            while left:
                chunk = stream.read(min(left, 1 << 20))
                if not chunk:
                    return f"bytes {offset}..{offset + length} (short read)"
                h.update(chunk)
                left -= len(chunk)
            count("read_back", length)
            if h.hexdigest() != digest:
                return f"bytes {offset}..{offset + length}"
    return None


def write_marker(
    ckpt_dir: Path,
    step: int,
    manifest_blob: bytes,
    incarnation: int | None = None,
    writer: dict[str, Any] | None = None,
) -> None:
    """`writer`: who commits it (checkpoint/ownership.py `marker_identity`: run_id and incarnation)."""
    marker = {
        "step": step,
        "manifest_sha256": hashlib.sha256(manifest_blob).hexdigest(),
        "committed_at": time.time(),
        "incarnation": incarnation,
        **(writer or {}),
    }
    atomic_write(ckpt_dir / MARKER, json.dumps(marker).encode())


def read_json(path: Path) -> Any:
    """Parse a small JSON file; anything else (missing, a symlink or FIFO, huge, not JSON) is a
    VerifyError. A FIFO is never opened for reading (it would block), a symlink never followed."""
    try:
        data = read_regular(path, MAX_JSON_BYTES)
    except FileNotFoundError:
        raise VerifyError(f"missing {path.name}") from None
    except UnsafePathError:
        raise VerifyError(f"{path.name} is {entry_kind(path) or 'unreadable'}, not a regular file") from None
    except OversizeFileError:
        raise VerifyError(f"{path.name} is implausibly large (over {MAX_JSON_BYTES} bytes)") from None
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError, huge ints
        raise VerifyError(f"{path.name} is not valid JSON: {type(err).__name__}") from err


def read_marker(ckpt_dir: Path) -> dict[str, Any]:
    marker = read_json(ckpt_dir / MARKER)
    if not isinstance(marker, dict):
        raise VerifyError(f"{MARKER} is not a JSON object")
    return marker


def verify_files(ckpt_dir: Path, checksums: bool, items_on_read: bool = False) -> dict[str, Any]:
    """Return the manifest if the checkpoint's files are complete, else raise VerifyError saying why.
    (`checkpoint.integrity.verify` is the whole check; this is its file-level part.) With
    `items_on_read`, files described by item digests are checked for size and tiling only: their bytes
    are the loader's to hash as it reads them (`safe_dcp`)."""
    marker = read_marker(ckpt_dir)
    if marker.get("step") != step_of(ckpt_dir) or isinstance(marker.get("step"), bool):
        raise VerifyError("commit marker does not name this directory's step")
    present = {p.relative_to(ckpt_dir).as_posix() for p in payload_files(ckpt_dir)}
    manifest_path = ckpt_dir / MANIFEST
    if entry_kind(manifest_path) is not None:
        raise VerifyError(f"{MANIFEST} is {entry_kind(manifest_path)}, not a regular file")
    if sha256_file(manifest_path) != marker.get("manifest_sha256"):
        raise VerifyError("manifest.json does not match the commit marker (tampered or torn)")
    manifest = read_json(manifest_path)
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict) or not listed:
        raise VerifyError("manifest lists no files")
    outside = sorted(name for name in listed if not plain_relative_name(name))
    if outside:
        raise VerifyError(f"manifest names paths outside the checkpoint: {', '.join(map(repr, outside[:5]))}")
    unexpected = sorted(present - set(listed))
    if unexpected:
        raise VerifyError(f"files not in the manifest: {', '.join(unexpected[:5])}")
    for name, entry in sorted(listed.items()):
        path = ckpt_dir / name
        if not isinstance(entry, dict):
            raise VerifyError(f"{name}: malformed manifest entry")
        if name not in present:
            raise VerifyError(f"missing file {name}")
        size = os.lstat(path).st_size
        if size != entry.get("size") or isinstance(entry.get("size"), bool):
            raise VerifyError(f"{name}: size {size} != manifest {entry.get('size')} (truncated?)")
        if "items" in entry and manifest.get("version") == 2 and "sha256" not in entry:
            _check_items(name, entry["items"], size)
            bad = _hash_items(path, entry["items"]) if checksums and not items_on_read else None
            if bad is not None:
                raise VerifyError(f"{name}: SHA-256 mismatch (corrupted) in {bad}")
            continue
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise VerifyError(f"{name}: malformed SHA-256 in the manifest")
        if checksums:
            count("read_back", size)
            if sha256_file(path) != digest:
                raise VerifyError(f"{name}: SHA-256 mismatch (corrupted)")
    return manifest


def item_digests(ckpt_dir: Path, files: set[str] | None = None) -> dict[str, dict[tuple[int, int], str]]:
    """file -> (offset, length) -> SHA-256 of every item the manifest hashes per item, for a reader
    that checks bytes as it reads them. The manifest is re-bound to the marker here, on the reading
    rank, so a manifest swapped after rank 0 verified it is refused. Empty for a v1 manifest (all of its
    files were hashed whole before the load)."""
    manifest_path = ckpt_dir / MANIFEST
    if sha256_file(manifest_path) != read_marker(ckpt_dir).get("manifest_sha256"):
        raise VerifyError("manifest.json does not match the commit marker (tampered or torn)")
    manifest = read_json(manifest_path)
    if not isinstance(manifest, dict) or manifest.get("version") != 2:
        return {}
    found: dict[str, dict[tuple[int, int], str]] = {}
    for name, entry in manifest["files"].items():
        if isinstance(entry, dict) and "items" in entry:
            _check_items(name, entry["items"], entry.get("size"))
            found[name] = {(o, n): d for o, n, d in entry["items"]}
    return found
