"""The commit protocol and its naive ablation, as two classes with the same four duties: which checkpoint a
resume may use, what a load that fails means, what restored weights that are not the saved ones mean, and
how a finished save is published.

`AtomicCommit` (the protocol, docs/checkpointing.md): a checkpoint is used only if it verifies; one that
fails is quarantined; a load that fails or restores other weights is a failed restore (quarantine, fall
back); a save is published by its manifest and, last and atomically, its commit marker.

`TrustingCommit` (checkpoint.atomic_commit = false) reproduces the naive trainer the ablation measures: "the
directory exists, so it is complete"; it loads what it can, keeps what it got, and publishes nothing but
the `latest` hint. Chosen by checkpoint/mechanisms.py, never by the code that calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from truestep.checkpoint.catalog import step_dirs, step_of
from truestep.checkpoint.errors import CheckpointContentError, raise_load_error
from truestep.checkpoint.manifest import VerifyError, write_marker
from truestep.checkpoint.manifest_shards import ShardRecord, write_manifest_v3
from truestep.checkpoint.restored import DigestCheck
from truestep.config.schema import CheckpointConfig
from truestep.core.errors import RefusedError
from truestep.faults.hooks import fault_point
from truestep.telemetry.run_logs import RunLogs


@dataclass(frozen=True)
class Publication:
    """A finished save, as rank 0 publishes it."""

    ckpt_dir: Path
    step: int
    shard_records: Callable[[], list[ShardRecord]]
    """Every rank's manifest-shard record (checkpoint/manifest_shards.py), gathered by DCP to rank 0's
    writer."""
    check_fence: Callable[[], None]
    """Raises FencedError once this attempt no longer owns the run directory (right before the marker)."""
    marker_fields: dict[str, Any]
    """Who commits it (checkpoint/ownership.py `marker_identity`)."""
    incarnation: int


class CommitProtocol(Protocol):
    keeps_other_weights: bool
    """Restored weights whose digest differs are kept (True only for the naive ablation)."""
    loads_over_init: bool
    """The model is initialized before any restore, which loads over it and keeps whatever part of it
    a failed load did not overwrite (True only for the naive ablation: the trainer it reproduces
    initializes at build). Under the protocol a resume draws no random init: a failed load is a failed
    restore, and a fresh start initializes afterwards."""

    def pick(self, root: Path, cfg: CheckpointConfig, logs: RunLogs) -> int:
        """Rank 0: the step to resume from, or one of the resolver's NO_CHECKPOINT / NONE_VERIFIED."""
        ...

    def load_failed(self, ckpt_dir: Path, err: BaseException, logs: RunLogs) -> bool:
        """A DCP load of `ckpt_dir` raised `err`: raise the refusal it is, or (naive) log it and return
        whether the weights were restored."""
        ...

    def digest_differs(self, ckpt_dir: Path, restored: str, saved: str) -> DigestCheck:
        """The restored parameters are not the saved ones: raise, or (naive) keep them."""
        ...

    def publish(self, save: Publication) -> None:
        """Rank 0, once every rank's write is done: make the checkpoint usable by a resume."""
        ...


class AtomicCommit:
    keeps_other_weights = False
    loads_over_init = False

    def pick(self, root: Path, cfg: CheckpointConfig, logs: RunLogs) -> int:
        from truestep.checkpoint.resolver import pick_verified  # the resolver imports this module

        return pick_verified(root, cfg, logs)

    def load_failed(self, ckpt_dir: Path, err: BaseException, logs: RunLogs) -> bool:
        raise_load_error(ckpt_dir, err)
        return False  # unreachable: raise_load_error always raises

    def digest_differs(self, ckpt_dir: Path, restored: str, saved: str) -> DigestCheck:
        raise CheckpointContentError(
            f"the parameters restored from {ckpt_dir} are not the ones saved: digest {restored[:12]} != "
            f"{saved[:12]} recorded at save (checkpoint.verify_restored_digest)"
        )

    def publish(self, save: Publication) -> None:
        fault_point("save:before-manifest", step=save.step)
        try:
            manifest = write_manifest_v3(save.ckpt_dir, save.step, save.shard_records())
        except VerifyError as err:  # a symlink or FIFO appeared among the files being committed
            raise RefusedError(
                f"not committing {save.ckpt_dir}: {err}; something other than this run writes into its "
                "checkpoint directory"
            ) from err
        fault_point("save:before-marker", step=save.step)
        save.check_fence()
        write_marker(save.ckpt_dir, save.step, manifest, save.incarnation, save.marker_fields)
        fault_point("save:after-marker", step=save.step)


class TrustingCommit:
    keeps_other_weights = True
    loads_over_init = True

    def pick(self, root: Path, cfg: CheckpointConfig, logs: RunLogs) -> int:
        from truestep.checkpoint.resolver import nothing_to_resume, set_aside_strays

        set_aside_strays(root, logs)
        candidates = step_dirs(root)
        return (step_of(candidates[0]) or 0) if candidates else nothing_to_resume(root, [], logs)

    def load_failed(self, ckpt_dir: Path, err: BaseException, logs: RunLogs) -> bool:
        # Like a naive trainer that trusts a torn directory: load what is there and carry on (strict=False
        # style). Loud in the event log, silent in training.
        logs.event("naive_partial_restore", path=str(ckpt_dir), error=f"{type(err).__name__}: {err}")
        return False

    def digest_differs(self, ckpt_dir: Path, restored: str, saved: str) -> DigestCheck:
        return DigestCheck.DIFFERS_KEPT

    def publish(self, save: Publication) -> None:
        return None  # no manifest, no marker: the directory's existence is the whole protocol
