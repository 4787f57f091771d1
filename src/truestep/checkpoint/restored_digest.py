"""What was loaded is what was saved: after a restore into the layout that saved the checkpoint, the
parameter digest of the restored model (telemetry/digest.py, layout-dependent by design) must equal the
digest the save recorded in the checkpoint's save record (checkpoint/save_record.py). A mismatch is a
failed restore for the commit protocol (quarantine, fall back) and is kept by its naive ablation, which
the resume self-check then flags at its first step.

The saved digest is read from the checkpoint, never from the event log: a line appended to events.jsonl
cannot make a genuine checkpoint fail, nor a wrong one pass. Rank 0 reads it and compares; every rank
learns the outcome as the enum it is (`broadcast_choice`).

Switch: checkpoint.verify_restored_digest (`SkipRestoredDigest` when off). Not comparable when the layout
changed; "not recorded" when the checkpoint holds no save record (made before they existed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from truestep.checkpoint.restored import DigestCheck
from truestep.checkpoint.save_record import SaveRecord
from truestep.parallel.dist import DistContext, broadcast_choice
from truestep.telemetry.run_logs import RunLogs

if TYPE_CHECKING:
    from truestep.checkpoint.commit_protocol import CommitProtocol


@dataclass(frozen=True)
class DigestOutcome:
    check: DigestCheck
    restored: str | None
    """The restored parameters' digest (None when not computed)."""
    saved: str | None


@dataclass(frozen=True)
class DigestSubject:
    """A restore whose parameters are to be checked against its checkpoint's save record."""

    digest_of_restored: Callable[[], str]
    """Collective: the restored parameters' digest."""
    record: SaveRecord | None
    layout_changed: bool
    ckpt_dir: Path
    ctx: DistContext
    logs: RunLogs
    commit: CommitProtocol


class RestoredDigestPolicy(Protocol):
    def check(self, restore: DigestSubject) -> DigestOutcome:
        """Collective. Raises CheckpointContentError (via the commit protocol) on every rank when the
        restored parameters are not the saved ones and the protocol does not keep them."""
        ...


class CheckRestoredDigest:
    def check(self, restore: DigestSubject) -> DigestOutcome:
        if restore.layout_changed:
            return DigestOutcome(DigestCheck.NOT_COMPARABLE, None, None)
        got = restore.digest_of_restored()  # collective
        record = restore.record
        outcome = DigestCheck.NOT_RECORDED
        if restore.ctx.is_main and record is not None:
            outcome = DigestCheck.MATCHES if record.param_digest == got else DigestCheck.DIFFERS_KEPT
        outcome = broadcast_choice(outcome, restore.ctx)
        saved = record.param_digest if record is not None else None
        if outcome == DigestCheck.DIFFERS_KEPT:
            restore.logs.event(
                "restore_digest_mismatch",
                path=str(restore.ckpt_dir),
                step=record.step if record is not None else None,
                saved=saved,
                restored=got,
                quarantined=not restore.commit.keeps_other_weights,
            )
            outcome = restore.commit.digest_differs(restore.ckpt_dir, got, saved or "?")
        return DigestOutcome(outcome, got, saved)


class SkipRestoredDigest:
    def check(self, restore: DigestSubject) -> DigestOutcome:
        record = restore.record
        return DigestOutcome(DigestCheck.OFF, None, record.param_digest if record is not None else None)
