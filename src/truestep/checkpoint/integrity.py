"""Is this directory a complete, self-consistent checkpoint? The one check the resolver, `ckpt`,
export, `init_from` and generation all use.

A checkpoint verifies iff
1. its files are complete (`manifest.verify_files`: marker, manifest, sizes, SHA-256, nothing unlisted,
   only regular files); at resume (`items_on_read`) the shards' bytes are hashed by the rank that loads
   them, while it loads them (`safe_dcp`), instead of by rank 0 beforehand;
2. its DCP metadata is safe to load (`safe_dcp.read_dcp_metadata`) and every file a reader would open is
   one of the files the manifest lists with its hash, so a storage path can never point at another
   step's shard, outside the directory, at a symlink or at a FIFO;
3. its rank-state files agree with the directory: the step of every rank file is the step in the
   directory name and in the marker, and the files are exactly the ranks of the recorded layout; its save
   record (when it has one) is well formed and records the same step.

Every way a checkpoint can fail to parse or read is a verification failure of that checkpoint
(`verification_problem`), never an exception for the caller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from truestep.checkpoint.catalog import DCP_METADATA, step_of
from truestep.checkpoint.dcp_checks import storage_files
from truestep.checkpoint.errors import CheckpointContentError
from truestep.checkpoint.manifest import VerifyError, verify_files
from truestep.checkpoint.safe_dcp import read_dcp_metadata
from truestep.checkpoint.save_record import read_save_record
from truestep.checkpoint.state import rank_state_problem
from truestep.telemetry import startup


def verify(ckpt_dir: Path, checksums: bool, items_on_read: bool = False) -> dict[str, Any]:
    """Return the manifest if the checkpoint is complete and consistent, else raise VerifyError."""
    with startup.timed("verify"):
        return _verify(Path(ckpt_dir), checksums, items_on_read)


def _verify(ckpt_dir: Path, checksums: bool, items_on_read: bool) -> dict[str, Any]:
    manifest = verify_files(ckpt_dir, checksums, items_on_read)  # also: the manifest's step is this one
    step = step_of(ckpt_dir)
    listed = manifest["files"]
    if DCP_METADATA not in listed:
        raise VerifyError(f"no DCP {DCP_METADATA} listed in the manifest")
    try:
        metadata = read_dcp_metadata(ckpt_dir)
    except CheckpointContentError as err:
        raise VerifyError(str(err)) from err
    unlisted = sorted(storage_files(metadata) - set(listed))
    if unlisted:
        raise VerifyError(
            f"{DCP_METADATA} points at files the manifest does not list: {', '.join(unlisted[:5])}"
        )
    problem = rank_state_problem(ckpt_dir, step)
    if problem is not None:
        raise VerifyError(problem)
    read_save_record(ckpt_dir)  # VerifyError when present and not this step's
    return manifest


def verification_problem(ckpt_dir: Path, checksums: bool, items_on_read: bool = False) -> str | None:
    """None if the checkpoint verifies, else why not (never raises for anything the directory holds)."""
    try:
        verify(ckpt_dir, checksums, items_on_read)
    except VerifyError as err:
        return str(err)
    except (OSError, ValueError, TypeError, AttributeError, RecursionError, KeyError, OverflowError) as err:
        return f"unreadable: {type(err).__name__}: {err}"
    return None
