"""What one restore did, as one value: `Restored`, returned by every restore (from disk today; from a peer's
memory with resilience.snapshot_every_steps) and handed, unchanged, to everything that reports or judges the
resume (the restore event, the resume self-check, the NaN guard's rollback). Nothing about a restore travels
any other way: no dict of facts, no sentinel integers, no sentence used as a key.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class RestoreSource(enum.StrEnum):
    """Where the restored state came from."""

    DISK = "disk"
    """A committed checkpoint directory."""
    MEMORY = "memory"
    """The last agreed in-memory snapshot: this rank's own, or its buddy's copy of it."""


class RngPolicy(enum.StrEnum):
    RESTORED = "restored"
    """Same layout: every rank gets its own saved streams back."""
    REDERIVED = "rederived"
    """Layout changed: streams re-derived from (seed, dp_rank, step); the old ones have no counterpart."""
    FRESH_SEED = "fresh-seed"
    """Ablation (restore_rng_state=false): seeded as at a fresh start."""


class DigestCheck(enum.StrEnum):
    """Whether the restored parameters are the saved ones (the parameter digest the save recorded in the
    checkpoint, against the digest of what was loaded). The value is what the event log records."""

    MATCHES = "matches"
    """Bit for bit the saved parameters."""
    DIFFERS_KEPT = "differs (atomic_commit=false: restored anyway)"
    """Not the saved parameters, and the naive ablation (which trusts what it finds) kept them."""
    NOT_RECORDED = "not recorded"
    """The checkpoint holds no digest (made before digests were saved in checkpoints, or torn)."""
    NOT_COMPARABLE = "not comparable (layout changed)"
    """The digest is layout-dependent by design: another layout cannot be compared."""
    OFF = "off"
    """checkpoint.verify_restored_digest = false."""


@dataclass(frozen=True)
class Restored:
    """One completed restore: the rank's whole trajectory state now stands at `step`."""

    step: int
    """The step restored (the next step to train is step + 1)."""
    source: RestoreSource
    path: str
    """The checkpoint directory (disk) or the snapshot it came from (memory)."""
    layout_changed: bool
    """The saving run's layout differs from this one (the state was resharded)."""
    saved_layout: dict[str, Any]
    rng_policy: RngPolicy
    config_differences: tuple[str, ...]
    """Trajectory keys that differ from the saving run's (empty unless checkpoint.allow_config_change)."""
    weights: bool
    """The parameters were loaded (False only when the naive ablation could not load a torn checkpoint)."""
    optimizer: bool
    """The optimizer moments were loaded."""
    data_position: bool
    """The data position was restored (else the data order restarted at global batch 0)."""
    digest: DigestCheck
    param_digest: str | None
    """The restored parameters' digest (None when not computed)."""
    saved_param_digest: str | None
    """The digest the save recorded in the checkpoint (None when it holds none)."""
    saved_reason: str | None
    """Why the checkpoint was saved (interval, final, preempted, interrupted, stop_at_step), from its save
    record; None when the checkpoint holds none. A graceful stop's resume expects a stop witness."""
    optimizer_proven: bool = False
    """The restore proved the optimizer state bit-identical to the one captured, by its digest (the
    memory path's snapshots carry one); a disk restore does not (its save records the parameters' only)."""
    restore_s: float = 0.0
    """Seconds the restore took (resolve and verify excluded)."""
    steps_lost: int | None = None
    """Steps the failed attempt had completed past `step` (recomputed now); None when not known."""
    fell_back_past: tuple[int, ...] = field(default=())
    """Newer steps this restore passed over (quarantined, or a memory snapshot that was not agreed)."""

    @property
    def graceful(self) -> bool:
        """The checkpoint was the emergency save of a graceful stop (nothing is replayed after it)."""
        return self.saved_reason in GRACEFUL_SAVE_REASONS

    def event_fields(self) -> dict[str, Any]:
        """The restore event's fields (names kept from the event log's history)."""
        fields: dict[str, Any] = {
            "step": self.step,
            "source": str(self.source),
            "path": self.path,
            "layout_changed": self.layout_changed,
            "saved_layout": self.saved_layout,
            "rng_policy": str(self.rng_policy),
            "config_differences": list(self.config_differences),
            "restored_weights": self.weights,
            "restored_optimizer": self.optimizer,
            "restored_data_position": self.data_position,
            "restored_digest": str(self.digest),
            "restore_s": self.restore_s,
        }
        if self.param_digest is not None:
            fields["param_digest"] = self.param_digest
        if self.saved_param_digest is not None and self.digest == DigestCheck.DIFFERS_KEPT:
            fields["saved_param_digest"] = self.saved_param_digest
        if self.saved_reason is not None:
            fields["saved_reason"] = self.saved_reason
        if self.steps_lost is not None:
            fields["steps_lost"] = self.steps_lost
        if self.fell_back_past:
            fields["fell_back_past"] = list(self.fell_back_past)
        return fields


GRACEFUL_SAVE_REASONS = frozenset({"preempted", "interrupted", "stop_at_step"})
"""Save reasons of a graceful stop (core.status.StopReason values): the resume has nothing to replay."""
