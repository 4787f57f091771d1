"""Read-only views of checkpoint directories for operators (`truestep ckpt list|verify|inspect`).

Everything here reads JSON only (the commit marker, the manifest, the rank-state files) through
`manifest.read_json`, and judges completeness with `integrity.verify`, the same check the resolver uses
(which reads DCP's `.metadata` through the allow-list unpickler of `safe_dcp`, never stock pickle; the
`.distcp` shards are only sized and hashed). Nothing here follows a symlink into a directory or opens a
FIFO, and no file of a checkpoint can make these views raise: problems are reported, not thrown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from truestep.checkpoint.catalog import (
    MANIFEST,
    MARKER,
    checkpoint_root,
    is_committed,
    is_rank_state_name,
    is_set_aside,
    quarantined_dirs,
    rank_state_name,
    read_latest_hint,
    set_aside_slug,
    set_aside_step,
    step_dirs,
    step_of,
)
from truestep.checkpoint.integrity import verification_problem
from truestep.checkpoint.manifest import VerifyError, read_json
from truestep.checkpoint.state import read_rank_state
from truestep.core.fsio import OversizeFileError, read_regular
from truestep.core.names import EVENTS_FILE

MAX_EVENTS_BYTES = 256 << 20

__all__ = ["checkpoint_root", "inspect_checkpoint", "is_checkpoint_dir", "list_checkpoints"]


def is_checkpoint_dir(path: Path) -> bool:
    """A live (`step_XXXXXXXX`) or quarantined (`step_XXXXXXXX.<ms>.<reason>`) checkpoint directory."""
    return path.is_dir() and set_aside_step(path) is not None


def _disk_usage(path: Path) -> tuple[int, int]:
    """(regular files, total bytes) under path, symlinks not followed."""
    count = total = 0
    for p in path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            count += 1
            total += p.stat().st_size
    return count, total


def _verify(path: Path, checksums: bool) -> tuple[bool, str | None]:
    problem = verification_problem(path, checksums)
    return problem is None, problem


def _quarantine_reasons(root: Path) -> dict[str, str]:
    """moved_to name -> reason, from the run's events.jsonl when the root is <run>/checkpoints."""
    events = root.parent / EVENTS_FILE
    reasons: dict[str, str] = {}
    try:
        text = read_regular(events, MAX_EVENTS_BYTES).decode("utf-8", errors="replace")
    except (OSError, OversizeFileError):  # absent, a symlink or FIFO, or huge: no reasons, not a crash
        return reasons
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict) and record.get("event") == "checkpoint_quarantined":
            moved_to = record.get("moved_to")
            if isinstance(moved_to, str):
                reasons[Path(moved_to).name] = str(record.get("reason", ""))
    return reasons


def list_checkpoints(root: Path, checksums: bool = True) -> list[dict[str, Any]]:
    """Every checkpoint under root (a checkpoint root or a run directory).

    Live `step_XXXXXXXX` directories come first, newest step first, each verified exactly as the
    resolver would (`status` "ok" or "invalid" with a `reason`); then the quarantined ones (`status`
    "quarantined", `quarantined` true, `reason` from events.jsonl or the directory name), which are
    never verified nor resumed from.
    """
    root = checkpoint_root(root)
    hint = read_latest_hint(root)
    entries: list[dict[str, Any]] = []
    for path in step_dirs(root):
        verified, reason = _verify(path, checksums)
        files, size = _disk_usage(path)
        entries.append(
            {
                "step": step_of(path),
                "name": path.name,
                "path": str(path),
                "committed": is_committed(path),
                "verified": verified,
                "checksums": checksums,
                "status": "ok" if verified else "invalid",
                "reason": reason,
                "files": files,
                "size_bytes": size,
                "latest_hint": path.name == hint,
                "quarantined": False,
            }
        )
    quarantined = quarantined_dirs(root)
    if quarantined:
        reasons = _quarantine_reasons(root)
        for path in quarantined:
            files, size = _disk_usage(path)
            slug = set_aside_slug(path)
            entries.append(
                {
                    "step": set_aside_step(path),
                    "name": path.name,
                    "path": str(path),
                    "committed": is_committed(path),
                    "verified": False,
                    "checksums": checksums,
                    "status": "quarantined",
                    "reason": reasons.get(path.name) or slug or None,
                    "files": files,
                    "size_bytes": size,
                    "latest_hint": False,
                    "quarantined": True,
                }
            )
    return entries


def _read_json_field(path: Path) -> tuple[Any, str | None]:
    """(parsed JSON or None, error or None); never raises for a bad file."""
    try:
        return read_json(path), None
    except VerifyError as err:
        return None, str(err)
    except OSError as err:
        return None, f"{path.name}: {err}"


def inspect_checkpoint(path: Path, checksums: bool = True) -> dict[str, Any]:
    """What one checkpoint directory holds, from its JSON files only, and whether it verifies.

    Raises FileNotFoundError / NotADirectoryError for a path that is not a directory. Problems with
    the JSON files themselves are reported in `problems`, never raised.
    """
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such directory")
    if not path.is_dir():
        raise NotADirectoryError(f"{path}: not a directory")
    quarantined = is_set_aside(path)
    step = set_aside_step(path)
    problems: list[str] = []

    verified, reason = _verify(path, checksums)

    marker, marker_error = _read_json_field(path / MARKER)
    if marker_error and (path / MARKER).exists():
        problems.append(marker_error)
    if marker is not None and not isinstance(marker, dict):
        problems.append(f"{MARKER} is not a JSON object")
        marker = None

    manifest, manifest_error = _read_json_field(path / MANIFEST)
    if manifest_error and (path / MANIFEST).exists():
        problems.append(manifest_error)
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if manifest is not None and not isinstance(listed, dict):
        problems.append(f"{MANIFEST} has no file table")
        listed = None
    manifest_bytes = None
    if listed is not None:
        sizes = [e.get("size") for e in listed.values() if isinstance(e, dict)]
        manifest_bytes = sum(s for s in sizes if isinstance(s, int))

    rank_files = sorted(p.name for p in path.iterdir() if p.is_file() and is_rank_state_name(p.name))
    saved = None
    first = rank_state_name(0)
    if (path / first).exists():
        try:
            saved = read_rank_state(path, 0)
        except VerifyError as err:
            problems.append(str(err))
        except OSError as err:
            problems.append(f"{first}: {err}")
    else:
        problems.append(f"missing {first}")
    layout = saved.layout if saved else None
    world_size = layout.get("world_size") if layout else None
    saved_step = saved.step if saved else None
    if step is not None and saved_step is not None and saved_step != step:
        problems.append(f"{first} records step {saved_step}, directory says {step}")
    if isinstance(world_size, int) and rank_files and len(rank_files) != world_size:
        problems.append(f"{len(rank_files)} rank-state files for world_size {world_size}")

    files, total = _disk_usage(path)
    recorded = None
    if quarantined:  # why it was set aside, as recorded then (the run's events), else its name's slug
        recorded = _quarantine_reasons(path.parent.parent).get(path.name) or set_aside_slug(path) or None
    return {
        "path": str(path),
        "step": step,
        "quarantined": quarantined,
        "quarantine_reason": recorded,
        "verified": verified,
        "checksums": checksums,
        "reason": reason,
        "committed": is_committed(path),
        "marker": marker,
        "layout": layout,
        "world_size": world_size,
        "rank_files": rank_files,
        "config_fingerprint": saved.config_fingerprint if saved else None,
        "config_keys": saved.config_keys if saved else None,
        "train_state": saved.state.train_state if saved else None,
        "data_position": saved.state.data_position if saved else None,
        "files": files,
        "total_bytes": total,
        "manifest_files": len(listed) if listed is not None else None,
        "manifest_bytes": manifest_bytes,
        "problems": problems,
    }
