"""Whose checkpoint is this: the run-directory identity a commit marker records.

The lease of a run directory carries a `run_id` (a UUID made when the directory's first lease is
taken, kept across jobs and requeues: resilience/lease.py). Marker version 2 records it next to the
incarnation (the attempt number) that committed the checkpoint; version 1 markers (older truestep)
record only the incarnation and are still read and resumed from.

Incarnations count attempts of one run directory, so they are compared only between checkpoints of the
same run: copying `A/checkpoints` into a fresh `B` (to branch or fine-tune a run) hands B markers with
A's incarnations, which must never make B's own saves look stale. So:
- fencing by marker (`newer_own_commit`) looks only at markers of this run;
- retention (`own_committed`) deletes only this run's own committed checkpoints: a copied checkpoint,
  or one whose marker is v1 or unreadable, is read-only to us;
- a resume from a checkpoint of another run says so once (`foreign_run`).
A run without a run_id (no lease) keeps the old rules: every marker is its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from truestep.checkpoint.catalog import committed_dirs
from truestep.checkpoint.manifest import VerifyError, read_marker
from truestep.core.errors import RunDirBusyError

MARKER_VERSION = 2
"""Markers that record the run directory's identity (`run_id`); version 1 has the incarnation only."""


def current_run_id(run_dir: Path) -> str:
    """The identity of `run_dir` its lease records ("" when it has no lease or the lease has none)."""
    from truestep.resilience.lease import read_lease  # the resilience room reads the lease

    try:
        holder = read_lease(run_dir)
    except RunDirBusyError:  # an unreadable lease: this attempt's fence refuses it in one line
        return ""
    return holder.run_id if holder is not None else ""


def marker_identity(run_id: str, incarnation: int | None) -> dict[str, Any]:
    """What a marker written by `run_id`'s attempt `incarnation` records about its writer."""
    if not run_id:
        return {"incarnation": incarnation}
    return {"version": MARKER_VERSION, "run_id": run_id, "incarnation": incarnation}


def _owner(ckpt_dir: Path) -> tuple[str | None, int | None] | None:
    """(run_id or None for a v1 marker, incarnation or None); None when the marker cannot be read."""
    try:
        marker = read_marker(ckpt_dir)
    except VerifyError:
        return None
    run_id = marker.get("run_id")
    incarnation = marker.get("incarnation")
    return (
        run_id if isinstance(run_id, str) and run_id else None,
        incarnation if isinstance(incarnation, int) and not isinstance(incarnation, bool) else None,
    )


def _is_ours(owner: tuple[str | None, int | None] | None, run_id: str) -> bool:
    if owner is None:
        return False
    return owner[0] == run_id if run_id else True


def newer_own_commit(root: Path, run_id: str, incarnation: int) -> tuple[Path, int] | None:
    """A checkpoint of this run committed by a newer attempt than `incarnation` (a stale writer must
    not publish after it), or None."""
    for ckpt_dir in committed_dirs(root):
        owner = _owner(ckpt_dir)
        if _is_ours(owner, run_id) and owner is not None and owner[1] is not None and owner[1] > incarnation:
            return ckpt_dir, owner[1]
    return None


def own_committed(root: Path, run_id: str) -> list[Path]:
    """This run's own committed checkpoints, newest first: the only ones retention may delete."""
    return [d for d in committed_dirs(root) if _is_ours(_owner(d), run_id)]


def foreign_run(ckpt_dir: Path, run_id: str) -> str | None:
    """The run_id of another run directory whose checkpoint `ckpt_dir` is (copied here), else None (it
    is this run's own, or its v1 marker does not say)."""
    owner = _owner(ckpt_dir)
    if not run_id or owner is None or owner[0] is None or owner[0] == run_id:
        return None
    return owner[0]
