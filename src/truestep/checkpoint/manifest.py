"""The commit protocol's two files: the manifest (every file, size, SHA-256) and the commit marker.

A checkpoint is complete iff its marker parses, names the directory's step and the manifest's SHA-256,
and every file the manifest lists is present with its size (and checksum, when verifying them), with no
file the manifest does not list. The marker also records the incarnation (job-wide attempt) that
committed it: the run directory lease's fencing token.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from truestep.checkpoint.catalog import MANIFEST, MARKER, step_of
from truestep.core.fsio import atomic_write, fsync_file, sha256_file

MAX_JSON_BYTES = 64 << 20


class VerifyError(Exception):
    """Why a checkpoint directory is not a complete checkpoint (short, event-log friendly)."""


def payload_files(ckpt_dir: Path) -> list[Path]:
    """Every regular file except the manifest and the marker, sorted by relative name."""
    skip = {MANIFEST, MARKER}
    return sorted(
        p for p in ckpt_dir.rglob("*") if p.is_file() and p.relative_to(ckpt_dir).as_posix() not in skip
    )


def build_manifest(ckpt_dir: Path, step: int) -> dict[str, Any]:
    files = {}
    for path in payload_files(ckpt_dir):
        fsync_file(path)  # durability of every rank's files before they are declared complete
        files[path.relative_to(ckpt_dir).as_posix()] = {
            "size": path.stat().st_size,
            "sha256": sha256_file(path),
        }
    return {"format": "truestep-manifest", "version": 1, "step": step, "files": files}


def write_manifest(ckpt_dir: Path, step: int) -> bytes:
    blob = json.dumps(build_manifest(ckpt_dir, step), indent=1, sort_keys=True).encode()
    atomic_write(ckpt_dir / MANIFEST, blob)
    return blob


def write_marker(ckpt_dir: Path, step: int, manifest_blob: bytes, incarnation: int | None = None) -> None:
    marker = {
        "step": step,
        "manifest_sha256": hashlib.sha256(manifest_blob).hexdigest(),
        "committed_at": time.time(),
        "incarnation": incarnation,
    }
    atomic_write(ckpt_dir / MARKER, json.dumps(marker).encode())


def read_json(path: Path) -> Any:
    """Parse a small JSON file; anything else (missing, huge, not JSON) is a VerifyError."""
    if path.is_symlink() or not path.is_file():
        raise VerifyError(f"missing {path.name}")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise VerifyError(f"{path.name} is implausibly large")
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError, huge ints
        raise VerifyError(f"{path.name} is not valid JSON: {type(err).__name__}") from err


def read_marker(ckpt_dir: Path) -> dict[str, Any]:
    marker = read_json(ckpt_dir / MARKER)
    if not isinstance(marker, dict):
        raise VerifyError(f"{MARKER} is not a JSON object")
    return marker


def verify(ckpt_dir: Path, checksums: bool) -> dict[str, Any]:
    """Return the manifest if the checkpoint is complete, else raise VerifyError saying why."""
    marker = read_marker(ckpt_dir)
    if marker.get("step") != step_of(ckpt_dir):
        raise VerifyError("commit marker does not name this directory's step")
    manifest_path = ckpt_dir / MANIFEST
    if manifest_path.is_symlink() or not manifest_path.is_file():
        raise VerifyError("missing manifest.json")
    if sha256_file(manifest_path) != marker.get("manifest_sha256"):
        raise VerifyError("manifest.json does not match the commit marker (tampered or torn)")
    manifest = read_json(manifest_path)
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict) or not listed:
        raise VerifyError("manifest lists no files")
    present = {p.relative_to(ckpt_dir).as_posix() for p in payload_files(ckpt_dir)}
    unexpected = sorted(present - set(listed))
    if unexpected:
        raise VerifyError(f"files not in the manifest: {', '.join(unexpected[:5])}")
    for name, entry in sorted(listed.items()):
        path = ckpt_dir / name
        if not isinstance(entry, dict):
            raise VerifyError(f"{name}: malformed manifest entry")
        if name not in present:
            raise VerifyError(f"missing file {name}")
        size = path.stat().st_size
        if size != entry.get("size"):
            raise VerifyError(f"{name}: size {size} != manifest {entry.get('size')} (truncated?)")
        if checksums and sha256_file(path) != entry.get("sha256"):
            raise VerifyError(f"{name}: SHA-256 mismatch (corrupted)")
    return manifest


def verification_problem(ckpt_dir: Path, checksums: bool) -> str | None:
    """None if the checkpoint verifies, else why not. Every way a checkpoint can fail to parse or read
    is a verification failure of that checkpoint, never an exception for the caller."""
    try:
        verify(ckpt_dir, checksums)
    except VerifyError as err:
        return str(err)
    except (OSError, ValueError, TypeError, AttributeError, RecursionError) as err:
        return f"unreadable: {type(err).__name__}: {err}"
    return None
