"""The commit protocol's two files: the manifest (every file, size, SHA-256) and the commit marker.

Manifest version 1 holds one SHA-256 per file (rank 0 hashed every file after the write: `write_manifest`,
still used for weights-only exports and still read). Version 2 (`write_manifest_v2`, training saves
before round 3, still read) holds, for each `.distcp` shard, the SHA-256 of every storage item (`items`:
[offset, length, sha256], covering the file exactly), hashed by the rank that wrote it while writing;
only the small files (`.metadata`, rank state) are hashed by rank 0. Version 3 (every training save,
`manifest_shards.py`) moves each rank's item digests into that rank's own manifest shard, which
`manifest.json` lists with its SHA-256: rank 0 writes O(files), not O(items). A reader checks an
item's bytes as it reads them (`safe_dcp`), and the manifest shards it needs as it reads them
(`item_digests`); `verify_files(..., items_on_read=True)` leaves exactly those bytes to it.

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

from truestep.checkpoint.catalog import MANIFEST, MARKER, manifest_shard_name, step_of
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
SHARD_FORMAT = "truestep-manifest-shard"
"""The `format` of a rank's manifest shard (v3)."""


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
    manifest = build_manifest(ckpt_dir, step)
    blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
    atomic_write(ckpt_dir / MANIFEST, blob)
    count("manifest_entries", len(manifest["files"]))
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
    count("manifest_entries", sum(len(e.get("items", [None])) for e in files.values()))
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
    step = step_of(ckpt_dir)
    if manifest.get("step") != step or isinstance(manifest.get("step"), bool):
        raise VerifyError(f"manifest records step {manifest.get('step')!r:.40}, the directory says {step}")
    outside = sorted(name for name in listed if not plain_relative_name(name))
    if outside:
        raise VerifyError(f"manifest names paths outside the checkpoint: {', '.join(map(repr, outside[:5]))}")
    unexpected = sorted(present - set(listed))
    if unexpected:
        raise VerifyError(f"files not in the manifest: {', '.join(unexpected[:5])}")
    version = manifest.get("version")
    by_shard = files_by_shard(listed) if version == 3 else {}
    for name, entry in sorted(listed.items()):
        path = ckpt_dir / name
        if not isinstance(entry, dict):
            raise VerifyError(f"{name}: malformed manifest entry")
        if name not in present:
            raise VerifyError(f"missing {'manifest shard' if name in by_shard else 'file'} {name}")
        size = os.lstat(path).st_size
        if size != entry.get("size") or isinstance(entry.get("size"), bool):
            raise VerifyError(f"{name}: size {size} != manifest {entry.get('size')} (truncated?)")
        if "items" in entry and version == 2 and "sha256" not in entry:
            _check_items(name, entry["items"], size)
            bad = _hash_items(path, entry["items"]) if checksums and not items_on_read else None
            if bad is not None:
                raise VerifyError(f"{name}: SHA-256 mismatch (corrupted) in {bad}")
            continue
        if "shard" in entry and version == 3 and "sha256" not in entry:
            continue  # its items: with its manifest shard, below (or by the rank that reads it)
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise VerifyError(f"{name}: malformed SHA-256 in the manifest")
        if name in by_shard and items_on_read:
            continue  # a manifest shard: hashed by each rank that reads it (`item_digests`)
        if checksums:
            count("read_back", size)
            if sha256_file(path) != digest:
                raise VerifyError(f"{name}: SHA-256 mismatch (corrupted)")
    if checksums and not items_on_read:
        for shard, sizes in sorted(by_shard.items()):
            for name, items in read_shard(ckpt_dir, manifest, shard, sizes).items():
                bad = _hash_items(ckpt_dir / name, items)
                if bad is not None:
                    raise VerifyError(f"{name}: SHA-256 mismatch (corrupted) in {bad}")
    return manifest


def files_by_shard(listed: dict[str, Any]) -> dict[str, dict[str, int]]:
    """v3: manifest shard name -> {file it describes: size} (every listed shard, also one describing
    none). VerifyError for a shard entry that is not one, or a file pointing at an unlisted shard."""
    shards: dict[str, dict[str, int]] = {}
    for name, entry in listed.items():
        if isinstance(entry, dict) and "rank" in entry:
            rank = entry["rank"]
            if not isinstance(rank, int) or isinstance(rank, bool) or name != manifest_shard_name(rank):
                raise VerifyError(f"{name}: not the manifest shard of rank {rank!r:.20}")
            shards[name] = {}
    for name, entry in listed.items():
        if isinstance(entry, dict) and "shard" in entry:
            if entry["shard"] not in shards:
                raise VerifyError(f"{name}: its manifest shard {entry['shard']!r:.80} is not listed")
            shards[entry["shard"]][name] = entry.get("size")
    return shards


def read_shard(
    ckpt_dir: Path, manifest: dict[str, Any], shard: str, sizes: dict[str, int]
) -> dict[str, list[list[Any]]]:
    """The item digests in manifest shard `shard` (file -> [[offset, length, sha256], ...]), once its bytes
    hash to the SHA-256 `manifest` lists for it and it describes exactly the files `sizes` names, at
    those sizes, for this step and its rank. VerifyError otherwise (missing, swapped between ranks or
    steps, edited)."""
    entry = manifest["files"][shard]
    try:
        blob = read_regular(ckpt_dir / shard, MAX_JSON_BYTES)
    except FileNotFoundError:
        raise VerifyError(f"missing manifest shard {shard}") from None
    except (UnsafePathError, OversizeFileError):
        raise VerifyError(f"{shard} is {entry_kind(ckpt_dir / shard) or 'unreadable'} or huge") from None
    if hashlib.sha256(blob).hexdigest() != entry.get("sha256"):
        raise VerifyError(
            f"{shard}: SHA-256 does not match the manifest (a manifest shard swapped, replaced or corrupted)"
        )
    try:
        data = json.loads(blob)
    except (ValueError, RecursionError) as err:
        raise VerifyError(f"{shard} is not valid JSON: {type(err).__name__}") from err
    ok = isinstance(data, dict) and data.get("format") == SHARD_FORMAT and data.get("version") == 1
    files = data.get("files") if ok else None
    if not isinstance(files, dict):
        raise VerifyError(f"{shard} is not a truestep manifest shard (v1)")
    if data.get("step") != manifest.get("step") or data.get("rank") != entry.get("rank"):
        raise VerifyError(f"{shard} is rank {data.get('rank')!r:.20}'s of step {data.get('step')!r:.20}")
    if set(files) != set(sizes):
        raise VerifyError(f"{shard} describes other files than the manifest lists for it")
    found: dict[str, list[list[Any]]] = {}
    for name, described in files.items():
        items = described.get("items") if isinstance(described, dict) else None
        _check_items(name, items, sizes[name])
        found[name] = items  # type: ignore[assignment] - checked just above
    return found


def item_digests(ckpt_dir: Path, files: set[str] | None = None) -> dict[str, dict[tuple[int, int], str]]:
    """file -> (offset, length) -> SHA-256 of every item the manifest hashes per item, of `files` (None:
    all), for a reader that checks bytes as it reads them. The manifest is re-bound to the marker here,
    on the reading rank, so a manifest swapped after rank 0 verified it is refused; in v3 this rank reads
    only the manifest shards describing `files`, each checked against the manifest (`read_shard`). Empty
    for a v1 manifest (all of its files were hashed whole before the load)."""
    manifest_path = ckpt_dir / MANIFEST
    if sha256_file(manifest_path) != read_marker(ckpt_dir).get("manifest_sha256"):
        raise VerifyError("manifest.json does not match the commit marker (tampered or torn)")
    manifest = read_json(manifest_path)
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict) or manifest.get("version") not in (2, 3):
        return {}
    wanted = set(listed) if files is None else files
    found: dict[str, dict[tuple[int, int], str]] = {}
    if manifest["version"] == 2:
        for name in wanted:
            entry = listed.get(name)
            if isinstance(entry, dict) and "items" in entry:
                _check_items(name, entry["items"], entry.get("size"))
                found[name] = {(o, n): d for o, n, d in entry["items"]}
        return found
    by_shard = files_by_shard(listed)
    shards = {listed[n]["shard"] for n in wanted if isinstance(listed.get(n), dict) and "shard" in listed[n]}
    for shard in sorted(shards):
        for name, items in read_shard(ckpt_dir, manifest, shard, by_shard[shard]).items():
            if name in wanted:
                found[name] = {(o, n): d for o, n, d in items}
    return found
