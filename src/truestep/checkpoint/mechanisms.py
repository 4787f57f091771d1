"""The checkpoint room's recovery mechanisms and their "be wrong this way" ablation variants, chosen once.

Every ablation switch (docs/checkpointing.md, "Ablation switches") is read here and nowhere else on a
rank's path -- tests/test_architecture.py checks it from the source. `choose(cfg)` turns the config into
the classes a rank uses; the resolver, the restore and the saver call what they were handed and never ask
which variant it is.

| switch | correct | ablation variant |
|---|---|---|
| `checkpoint.atomic_commit` | `AtomicCommit` | `TrustingCommit`: the newest directory is complete because it exists; what does not load is skipped; weights whose digest differs are kept |
| `checkpoint.restore_optimizer_state`, `restore_rng_state`, `restore_data_position` | `RestoreParts()` | the part left out of the restore |
| `checkpoint.verify_restored_digest` | `CheckRestoredDigest` | `SkipRestoredDigest` |
| `checkpoint.emulate_unstaged_async_save` (a test switch) | `StagedAsyncWrite` | `UnstagedAsyncWrite` |
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from truestep.checkpoint.commit_protocol import AtomicCommit, CommitProtocol, TrustingCommit
from truestep.checkpoint.restored_digest import CheckRestoredDigest, RestoredDigestPolicy, SkipRestoredDigest
from truestep.checkpoint.unstaged import unstaged_async_save
from truestep.config.schema import CheckpointConfig


@dataclass(frozen=True)
class RestoreParts:
    """Which parts of the trajectory state a restore puts back (all of them, unless ablated)."""

    optimizer: bool = True
    rng: bool = True
    data_position: bool = True


class ShardWrite(Protocol):
    """Starts writing a save's DCP state; returns its completion and the call that lets the write read
    the state (a no-op unless the write was held back: the unstaged emulation)."""

    is_async: bool

    def start(
        self, state: dict[str, Any], writer: FileSystemWriter, group: dist.ProcessGroup | None
    ) -> tuple[Future, Callable[[], None]]: ...


class SyncWrite:
    is_async = False

    def start(
        self, state: dict[str, Any], writer: FileSystemWriter, group: dist.ProcessGroup | None
    ) -> tuple[Future, Callable[[], None]]:
        dcp.save(state, storage_writer=writer)
        done: Future = Future()
        done.set_result(None)
        return done, _nothing


class StagedAsyncWrite:
    """DCP's async save: a staged copy is taken before the call returns, then written in the background."""

    is_async = True

    def start(
        self, state: dict[str, Any], writer: FileSystemWriter, group: dist.ProcessGroup | None
    ) -> tuple[Future, Callable[[], None]]:
        return dcp.async_save(state, storage_writer=writer, process_group=group), _nothing


class UnstagedAsyncWrite:
    """The class of bug where the background writer reads the live tensors (checkpoint/unstaged.py)."""

    is_async = True

    def start(
        self, state: dict[str, Any], writer: FileSystemWriter, group: dist.ProcessGroup | None
    ) -> tuple[Future, Callable[[], None]]:
        return unstaged_async_save(state, writer)


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class Mechanisms:
    """What one rank's checkpointing is made of, decided once from its config."""

    commit: CommitProtocol
    parts: RestoreParts
    digest: RestoredDigestPolicy
    write: ShardWrite

    def labels(self) -> dict[str, str]:
        """Which variant each mechanism is (for the run_start event)."""
        return {
            "commit": type(self.commit).__name__,
            "digest": type(self.digest).__name__,
            "write": type(self.write).__name__,
            "restore_parts": ",".join(k for k, v in vars(self.parts).items() if v) or "none",
        }


def choose(cfg: CheckpointConfig) -> Mechanisms:
    """The one place that reads the ablation switches."""
    write: ShardWrite
    if not cfg.async_save:
        write = SyncWrite()
    elif cfg.emulate_unstaged_async_save:
        write = UnstagedAsyncWrite()
    else:
        write = StagedAsyncWrite()
    return Mechanisms(
        commit=AtomicCommit() if cfg.atomic_commit else TrustingCommit(),
        parts=RestoreParts(
            optimizer=cfg.restore_optimizer_state,
            rng=cfg.restore_rng_state,
            data_position=cfg.restore_data_position,
        ),
        digest=CheckRestoredDigest() if cfg.verify_restored_digest else SkipRestoredDigest(),
        write=write,
    )
