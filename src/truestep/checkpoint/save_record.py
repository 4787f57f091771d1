"""The save record: what a save knows about itself that a restore must be checked against, inside the
checkpoint (`save.json`, written by rank 0 once the parameter digest is gathered, before the commit).

It lives in the checkpoint, not in the event log: the manifest lists it with its SHA-256 and the marker
binds the manifest, so it is as trustworthy as the shards, and nothing appended to events.jsonl can
change what a restore is checked against (the `checkpoint_save` event keeps a copy for the instrument).
A checkpoint made before save records existed has none: its restore says "not recorded".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from truestep.checkpoint.catalog import SAVE_RECORD, step_of
from truestep.checkpoint.manifest import VerifyError, read_json
from truestep.core.fsio import atomic_write

FORMAT = "truestep-save"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_REASON = re.compile(r"^[a-z_]{1,32}$")


@dataclass(frozen=True)
class SaveRecord:
    step: int
    reason: str
    """Why the save was made: interval, final, or the stop reason (preempted, interrupted, stop_at_step)."""
    param_digest: str
    """telemetry.digest.param_digest of the parameters saved (layout-dependent)."""


def write_save_record(ckpt_dir: Path, record: SaveRecord) -> None:
    blob = {
        "format": FORMAT,
        "version": 1,
        "step": record.step,
        "reason": record.reason,
        "param_digest": record.param_digest,
    }
    atomic_write(ckpt_dir / SAVE_RECORD, json.dumps(blob, sort_keys=True).encode())


def read_save_record(ckpt_dir: Path) -> SaveRecord | None:
    """The checkpoint's save record; None when it has none. VerifyError when the file is there but is not
    a save record of this directory's step (a checkpoint whose files contradict each other)."""
    if not (ckpt_dir / SAVE_RECORD).exists() and not (ckpt_dir / SAVE_RECORD).is_symlink():
        return None
    blob = read_json(ckpt_dir / SAVE_RECORD)
    if not isinstance(blob, dict) or blob.get("format") != FORMAT or blob.get("version") != 1:
        raise VerifyError(f"{SAVE_RECORD} is not a truestep save record (v1)")
    step, reason, digest = blob.get("step"), blob.get("reason"), blob.get("param_digest")
    if not isinstance(step, int) or isinstance(step, bool) or step != step_of(ckpt_dir):
        raise VerifyError(f"{SAVE_RECORD} records step {step!r:.40}, the directory says {step_of(ckpt_dir)}")
    if not isinstance(reason, str) or not _REASON.match(reason):
        raise VerifyError(f"{SAVE_RECORD} records reason {reason!r:.40}")
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise VerifyError(f"{SAVE_RECORD} records a malformed param_digest")
    return SaveRecord(step, reason, digest)
