"""On-disk names of the checkpoint directory (see docs/checkpointing.md for the full layout)."""

from __future__ import annotations

import re
from pathlib import Path

MARKER = "COMMITTED"
"""Commit marker: JSON {step, manifest_sha256}; written last, atomically, by rank 0."""
MANIFEST = "manifest.json"
"""Every other file of the checkpoint with its size and SHA-256."""
LATEST = "latest"
"""A hint naming the newest committed checkpoint; the resolver never trusts it."""
QUARANTINE = "quarantine"
"""Where torn or failed-verification checkpoints are moved, never deleted."""
RANK_STATE = "rank{rank:05d}.json"
"""Per-rank JSON state: counters, data position, RNG streams, config keys."""

_STEP_DIR = re.compile(r"^step_(\d{8})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def step_of(path: Path) -> int | None:
    match = _STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


def step_dirs(root: Path) -> list[Path]:
    """Checkpoint directories under root, newest step first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=lambda p: step_of(p) or 0, reverse=True)


def rank_state_name(rank: int) -> str:
    return RANK_STATE.format(rank=rank)
