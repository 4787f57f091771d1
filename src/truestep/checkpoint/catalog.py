"""The checkpoint catalog: the one owner of checkpoint names and of what is on disk.

Names (`step_XXXXXXXX/`, `COMMITTED`, `manifest.json`, `rankNNNNN.json`, `quarantine/`, `superseded/`,
the `latest` hint), listing, "is it committed", "the newest that verifies" and moving a checkpoint aside
all live here; the resume decision (resolver.py), the saver's retention, `ckpt list|verify|inspect`,
export, `init_from` and fault injection ask this module instead of globbing for themselves.
Nothing is ever deleted here: a checkpoint that fails is quarantined, one a user replaced is superseded.
The saver's retention deletes (committed checkpoints past `keep_last_n`, and with
`keep_quarantined` > 0 the oldest quarantined ones: `quarantined_past`).
"""

from __future__ import annotations

import os
import re
import stat
import time
import tomllib
from pathlib import Path

from truestep.checkpoint.errors import SetAsideError
from truestep.core.errors import RefusedError
from truestep.core.fsio import read_regular
from truestep.core.names import CHECKPOINTS_DIR, CONFIG_FILE

RUN_CONFIG_LIMIT = 1 << 20
"""A run directory's config.toml is a few KiB; a larger one is not truestep's."""

MARKER = "COMMITTED"
"""Commit marker: JSON {step, manifest_sha256, incarnation}; written last, atomically, by rank 0."""
MANIFEST = "manifest.json"
"""Every other file of the checkpoint with its size and SHA-256 (v3: the SHA-256 of each rank's
manifest shard, which holds that rank's item digests)."""
MANIFEST_SHARD = "manifest.rank{rank:05d}.json"
"""One rank's manifest shard (manifest v3): the SHA-256 of every storage item that rank wrote."""
LATEST = "latest"
"""A hint naming the newest committed checkpoint; the resolver never trusts it."""
QUARANTINE = "quarantine"
"""Where torn or failed-verification checkpoints are moved, never deleted."""
SUPERSEDED = "superseded"
"""Where `checkpoint.overwrite=true` moves the checkpoints of an earlier trajectory, never deleted."""
RANK_STATE = "rank{rank:05d}.json"
"""Per-rank JSON state: counters, data position, RNG streams, config keys."""
SAVE_RECORD = "save.json"
"""What the save knows about itself (step, reason, parameter digest): checkpoint/save_record.py."""
DCP_METADATA = ".metadata"
"""DCP's own metadata file (written by DCP's coordinator; read only through checkpoint/safe_dcp.py)."""

_STEP_DIR = re.compile(r"^step_(\d{8})$")
_SET_ASIDE = re.compile(r"^step_(\d{8})\.(\d+)\.?(.*)$")
_RANK_FILE = re.compile(r"^rank(\d{5})\.json$")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def rank_state_name(rank: int) -> str:
    return RANK_STATE.format(rank=rank)


def is_rank_state_name(name: str) -> bool:
    return _RANK_FILE.match(name) is not None


def manifest_shard_name(rank: int) -> str:
    return MANIFEST_SHARD.format(rank=rank)


def step_of(path: Path) -> int | None:
    """The step a live checkpoint directory's name says, else None."""
    match = _STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


def set_aside_step(path: Path) -> int | None:
    """The step of a live, quarantined or superseded checkpoint directory's name, else None."""
    step = step_of(path)
    if step is not None:
        return step
    match = _SET_ASIDE.match(path.name)
    return int(match.group(1)) if match else None


def set_aside_slug(path: Path) -> str:
    """The reason slug in a quarantined directory's name ("" if none)."""
    match = _SET_ASIDE.match(path.name)
    return match.group(3).replace("-", " ") if match else ""


def is_set_aside(path: Path) -> bool:
    return step_of(path) is None and _SET_ASIDE.match(path.name) is not None


def run_checkpoint_root(run_dir: Path, configured: str | None = None) -> Path:
    """Where the run in `run_dir` keeps its checkpoints -- the one answer, for training, `ckpt`, export
    and the analysis: `checkpoint.dir` when set, else `<run_dir>/checkpoints`. `configured` is that
    setting (a live run passes its own); None reads it from the run's resolved config (`config.toml`,
    written by the run at every start; absent: the default). RefusedError when that file is there but
    is not a readable config (a symlink, too large, not TOML)."""
    if configured is None:
        configured = _configured_dir(run_dir)
    return Path(configured) if configured else run_dir / CHECKPOINTS_DIR


def _configured_dir(run_dir: Path) -> str:
    path = run_dir / CONFIG_FILE
    try:
        data = read_regular(path, RUN_CONFIG_LIMIT)
    except FileNotFoundError:
        return ""
    except OSError as err:
        raise RefusedError(f"cannot tell where {run_dir} keeps its checkpoints: {path}: {err}") from None
    try:
        section = tomllib.loads(data.decode()).get("checkpoint", {})
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise RefusedError(f"cannot tell where {run_dir} keeps its checkpoints: {path}: {err}") from None
    configured = section.get("dir", "") if isinstance(section, dict) else ""
    if not isinstance(configured, str):
        raise RefusedError(f"{path}: checkpoint.dir is {configured!r}, not a path")
    return configured


def checkpoint_root(path: Path) -> Path:
    """The checkpoint root for `path`: a root itself (it holds checkpoints), or a run directory (one
    with checkpoints/ or a config.toml): its `run_checkpoint_root`."""
    if step_dirs(path) or not ((path / CHECKPOINTS_DIR).is_dir() or (path / CONFIG_FILE).is_file()):
        return path
    return run_checkpoint_root(path)


def _real_dirs(parent: Path) -> list[Path]:
    """Directories directly under `parent`; symlinks are never followed (a link to / is not a checkpoint)."""
    if not parent.is_dir() or parent.is_symlink():
        return []
    return [p for p in parent.iterdir() if p.is_dir() and not p.is_symlink()]


def step_dirs(root: Path) -> list[Path]:
    """Live checkpoint directories under root, newest step first."""
    found = [p for p in _real_dirs(root) if step_of(p) is not None]
    return sorted(found, key=lambda p: step_of(p) or 0, reverse=True)


def stray_step_entries(root: Path) -> list[Path]:
    """Entries named like a checkpoint (`step_XXXXXXXX`) that are not real directories: symlinks (to a
    directory or anywhere else), files, FIFOs. Never checkpoints; they stand where a save would write."""
    if not root.is_dir() or root.is_symlink():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and not stat.S_ISDIR(os.lstat(p).st_mode)]
    return sorted(found, key=lambda p: step_of(p) or 0, reverse=True)


def quarantined_dirs(root: Path) -> list[Path]:
    """Quarantined checkpoint directories, newest step first."""
    found = _real_dirs(root / QUARANTINE)
    return sorted(found, key=lambda p: (-(set_aside_step(p) or -1), p.name))


def quarantined_past(root: Path, keep: int) -> list[Path]:
    """The quarantined checkpoints older than the newest `keep` (by step, then by when they were moved
    aside): what `checkpoint.keep_quarantined` lets the saver delete right after a commit, when a newer
    committed checkpoint exists. `keep` 0 keeps them all."""
    if keep <= 0:
        return []

    def newest_first(path: Path) -> tuple[int, int]:
        match = _SET_ASIDE.match(path.name)
        return (int(match.group(1)), int(match.group(2))) if match else (-1, -1)

    return sorted(quarantined_dirs(root), key=newest_first, reverse=True)[keep:]


def is_committed(ckpt_dir: Path) -> bool:
    """The marker is there (whether the checkpoint still verifies is `integrity.verify`'s question)."""
    marker = ckpt_dir / MARKER
    return marker.is_file() and not marker.is_symlink()


def ever_committed(root: Path) -> bool:
    """Whether committed work exists on disk: a commit marker in a live or quarantined checkpoint.

    Judged from the markers themselves, not from whether quarantine/ has entries: a directory torn by a
    crash before its commit has no marker, and losing it loses nothing that was ever promised.
    """
    return any(is_committed(d) for d in step_dirs(root) + quarantined_dirs(root))


def committed_dirs(root: Path) -> list[Path]:
    return [d for d in step_dirs(root) if is_committed(d)]


def _slug(reason: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", reason.lower()).strip("-")[:48]


def _move_aside(ckpt_dir: Path, where: str, reason: str) -> Path:
    target_root = ckpt_dir.parent / where
    if target_root.is_symlink() or (os.path.lexists(target_root) and not target_root.is_dir()):
        what = "a symlink" if target_root.is_symlink() else "not a directory"
        raise SetAsideError(
            f"cannot move {ckpt_dir.name} to {target_root}: that path is {what}. Move it out of the way "
            f"(truestep keeps set-aside checkpoints there), then start again"
        )
    target_root.mkdir(exist_ok=True)
    target = target_root / f"{ckpt_dir.name}.{int(time.time() * 1000)}.{_slug(reason)}"
    ckpt_dir.rename(target)
    return target


def quarantine(ckpt_dir: Path, reason: str) -> Path:
    """Move a torn or corrupt checkpoint to quarantine/ (never deleted); returns where it went."""
    return _move_aside(ckpt_dir, QUARANTINE, reason)


def supersede(ckpt_dir: Path, reason: str) -> Path:
    """Move a checkpoint of an earlier trajectory to superseded/ (a user's `overwrite`, never deleted)."""
    return _move_aside(ckpt_dir, SUPERSEDED, reason)


def read_latest_hint(root: Path) -> str | None:
    """The `latest` hint's text (None if absent or unreadable); a symlink or FIFO is never opened."""
    path = root / LATEST
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode) or os.lstat(path).st_size > 4096:
            return None
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None
