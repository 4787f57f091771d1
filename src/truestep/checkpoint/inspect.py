"""Read-only views of checkpoint directories for operators (`truestep ckpt list|verify|inspect`).

Everything here reads JSON only (the commit marker, the manifest, the rank-state files) through
`manifest.read_json`, and judges completeness with `manifest.verify`, the same check the resolver uses.
Nothing is ever unpickled: DCP's `.metadata` and the `.distcp` shards are only sized and hashed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from truestep.checkpoint.layout import LATEST, MANIFEST, MARKER, QUARANTINE, step_dirs, step_of
from truestep.checkpoint.manifest import VerifyError, read_json, verify

EVENTS_FILE = "events.jsonl"
_QUARANTINED = re.compile(r"^step_(\d{8})\.(\d+)\.?(.*)$")
_RANK_FILE = re.compile(r"^rank(\d{5})\.json$")


def checkpoint_root(path: Path) -> Path:
    """The checkpoint root for `path`: a run directory (holding checkpoints/) or a root itself."""
    if (path / "checkpoints").is_dir() and not step_dirs(path):
        return path / "checkpoints"
    return path


def is_checkpoint_dir(path: Path) -> bool:
    """A live (`step_XXXXXXXX`) or quarantined (`step_XXXXXXXX.<ms>.<reason>`) checkpoint directory."""
    return path.is_dir() and (step_of(path) is not None or _QUARANTINED.match(path.name) is not None)


def _step_from_name(path: Path) -> int | None:
    step = step_of(path)
    if step is not None:
        return step
    match = _QUARANTINED.match(path.name)
    return int(match.group(1)) if match else None


def _disk_usage(path: Path) -> tuple[int, int]:
    """(regular files, total bytes) under path, symlinks not followed."""
    count = total = 0
    for p in path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            count += 1
            total += p.stat().st_size
    return count, total


def _verify(path: Path, checksums: bool) -> tuple[bool, str | None]:
    try:
        verify(path, checksums)
    except VerifyError as err:
        return False, str(err)
    except (OSError, ValueError, TypeError, AttributeError) as err:  # malformed beyond verify's checks
        return False, f"unreadable: {type(err).__name__}: {err}"
    return True, None


def _latest_hint(root: Path) -> str | None:
    try:
        return (root / LATEST).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _quarantine_reasons(root: Path) -> dict[str, str]:
    """moved_to name -> reason, from the run's events.jsonl when the root is <run>/checkpoints."""
    events = root.parent / EVENTS_FILE
    reasons: dict[str, str] = {}
    if not events.is_file():
        return reasons
    for line in events.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
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
    hint = _latest_hint(root)
    entries: list[dict[str, Any]] = []
    for path in step_dirs(root):
        verified, reason = _verify(path, checksums)
        files, size = _disk_usage(path)
        entries.append(
            {
                "step": step_of(path),
                "name": path.name,
                "path": str(path),
                "committed": (path / MARKER).is_file(),
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
    quarantine_dir = root / QUARANTINE
    if quarantine_dir.is_dir():
        reasons = _quarantine_reasons(root)
        quarantined = [p for p in quarantine_dir.iterdir() if p.is_dir()]
        quarantined.sort(key=lambda p: (-(_step_from_name(p) or -1), p.name))
        for path in quarantined:
            match = _QUARANTINED.match(path.name)
            files, size = _disk_usage(path)
            slug = match.group(3).replace("-", " ") if match else ""
            entries.append(
                {
                    "step": _step_from_name(path),
                    "name": path.name,
                    "path": str(path),
                    "committed": (path / MARKER).is_file(),
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
    quarantined = step_of(path) is None and _QUARANTINED.match(path.name) is not None
    step = _step_from_name(path)
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

    rank_files = sorted(p.name for p in path.iterdir() if p.is_file() and _RANK_FILE.match(p.name))
    rank_state, rank_error = _read_json_field(path / "rank00000.json")
    if rank_error:
        problems.append(rank_error)
    if rank_state is not None and not (
        isinstance(rank_state, dict) and rank_state.get("format") == "truestep-rank-state"
    ):
        problems.append("rank00000.json is not a truestep rank-state file")
        rank_state = None
    rank_state = rank_state or {}

    layout = rank_state.get("layout") if isinstance(rank_state.get("layout"), dict) else None
    train_state = rank_state.get("train_state") if isinstance(rank_state.get("train_state"), dict) else None
    world_size = layout.get("world_size") if layout else None
    saved_step = train_state.get("step") if train_state else None
    if step is not None and saved_step is not None and saved_step != step:
        problems.append(f"rank00000.json records step {saved_step}, directory says {step}")
    if isinstance(world_size, int) and rank_files and len(rank_files) != world_size:
        problems.append(f"{len(rank_files)} rank-state files for world_size {world_size}")

    files, total = _disk_usage(path)
    return {
        "path": str(path),
        "step": step,
        "quarantined": quarantined,
        "verified": verified,
        "checksums": checksums,
        "reason": reason,
        "committed": (path / MARKER).is_file(),
        "marker": marker,
        "layout": layout,
        "world_size": world_size,
        "rank_files": rank_files,
        "config_fingerprint": rank_state.get("config_fingerprint"),
        "config_keys": rank_state.get("config_keys"),
        "train_state": train_state,
        "data_position": rank_state.get("loader"),
        "files": files,
        "total_bytes": total,
        "manifest_files": len(listed) if listed is not None else None,
        "manifest_bytes": manifest_bytes,
        "problems": problems,
    }
