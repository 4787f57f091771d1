"""What was loaded is what was saved: after a restore into the layout that saved the checkpoint, the
parameter digest of the restored model (telemetry/digest.py, layout-dependent by design) must equal the
digest the save recorded in the event log (`checkpoint_save.param_digest`). A mismatch is a failed
restore: `CheckpointContentError`, which the checkpoint hook answers as for a checkpoint that fails to
load (quarantine it, fall back to the next older one) and says so.

With checkpoint.atomic_commit=false (the naive ablation: "a directory that exists is complete", nothing
is quarantined) a mismatch is reported, not acted on: the event is logged, the facts say "differs", and
the resume self-check (train/hooks/resume_check.py) flags the resume at its first step.

Switch: checkpoint.verify_restored_digest. Not checked (and said so in the facts) when the layout
changed, or when the save recorded no digest (a run made before this check, or a save killed before
its event was written).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from truestep.checkpoint.errors import CheckpointContentError
from truestep.core.names import EVENTS_FILE
from truestep.parallel.dist import broadcast_int
from truestep.telemetry.digest import param_digest
from truestep.telemetry.jsonl import iter_jsonl

if TYPE_CHECKING:
    from truestep.train.trainer import Trainer

NOT_RECORDED, MATCHES, DIFFERS = 0, 1, 2
DIFFERS_KEPT = "differs (atomic_commit=false: restored anyway)"
"""The restore facts' verdict when the digests differ in the naive ablation."""


def recorded_digest(events: Path, step: int, attempt: int) -> str | None:
    """The digest the latest save of `step` recorded (this attempt's own, for a rollback); None when none did."""
    found: str | None = None
    for e in iter_jsonl(events):
        when = e.get("attempt")
        if (
            e.get("event") == "checkpoint_save"
            and e.get("step") == step
            and isinstance(when, int)
            and when <= attempt
            and isinstance(e.get("param_digest"), str)
        ):
            found = e["param_digest"]
    return found


def verify_restored_digest(trainer: Trainer, ckpt_dir: Path, facts: dict[str, Any]) -> dict[str, Any]:
    """Collective. The digest facts for the checkpoint_restore event; raises CheckpointContentError on
    every rank when the restored parameters are not the saved ones."""
    if not trainer.cfg.checkpoint.verify_restored_digest:
        return {"restored_digest": "off"}
    if facts.get("layout_changed"):
        return {"restored_digest": "not comparable (layout changed)"}
    got = param_digest(trainer.model, trainer.ctx)
    outcome, want = NOT_RECORDED, None
    if trainer.ctx.is_main:
        try:
            want = recorded_digest(trainer.run_dir / EVENTS_FILE, int(facts["step"]), trainer.logs.attempt)
        except (OSError, UnicodeDecodeError, ValueError) as err:
            trainer.logs.event("restore_digest_unreadable", path=str(ckpt_dir), error=str(err))
        outcome = NOT_RECORDED if want is None else MATCHES if want == got else DIFFERS
    outcome = broadcast_int(outcome, trainer.ctx)
    if outcome == DIFFERS:
        kept = not trainer.cfg.checkpoint.atomic_commit
        trainer.logs.event(
            "restore_digest_mismatch",
            path=str(ckpt_dir),
            step=facts["step"],
            saved=want,
            restored=got,
            quarantined=not kept,
        )
        if kept:
            return {"restored_digest": DIFFERS_KEPT, "param_digest": got, "saved_param_digest": want}
        raise CheckpointContentError(
            f"the parameters restored from {ckpt_dir} are not the ones saved: digest {got[:12]} != "
            f"{(want or '?')[:12]} recorded at save (checkpoint.verify_restored_digest)"
        )
    return {"restored_digest": "matches" if outcome == MATCHES else "not recorded", "param_digest": got}
