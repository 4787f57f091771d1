"""Saving: shards via DCP (sync or async), then the commit on rank 0 once every rank's write is done.

Order inside one save (docs/checkpointing.md):
  1. every rank writes its rank-state JSON (temp + fsync + rename);
  2. DCP writes every rank's shards and the `.metadata` (fsynced by the writer); with async save this
     overlaps training and runs on its own gloo group, because sharing the default group with FSDP's
     collectives can deadlock;
  3. when DCP has finished on all ranks (its future resolves only after the coordinator gathered every
     rank's write results and wrote `.metadata`), rank 0 writes manifest.json and then COMMITTED.
A crash anywhere before 3 completes leaves a directory without a valid marker: never resumed from.
"""

from __future__ import annotations

import shutil
import threading
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from truestep.checkpoint.layout import LATEST, MARKER, step_dir_name, step_dirs, step_of
from truestep.checkpoint.manifest import write_manifest, write_marker
from truestep.checkpoint.state import dcp_state, write_rank_state
from truestep.faults.hooks import fault_point, set_context
from truestep.telemetry.digest import param_digest

if TYPE_CHECKING:
    from truestep.train.trainer import Trainer


class _ShardWriter(FileSystemWriter):
    """FileSystemWriter with the `save:mid-shards` fault point: this rank's shards are on disk,
    the coordinator's `.metadata` is not."""

    def __init__(self, path: Path, step: int) -> None:
        super().__init__(path, sync_files=True)
        self.step = step

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        written = super().write_data(plan, planner)
        written.wait()
        fault_point("save:mid-shards", step=self.step)
        return written


# A single process saves without a process group on purpose; DCP warns about exactly that.
warnings.filterwarnings("ignore", message=r"torch.distributed is disabled, unavailable or uninitialized")


@dataclass
class PendingSave:
    step: int
    ckpt_dir: Path
    future: Future
    started: float
    reason: str


class Checkpointer:
    def __init__(self, trainer: Trainer) -> None:
        self.cfg = trainer.cfg.checkpoint
        self.ctx = trainer.ctx
        self.logs = trainer.logs
        self.root = Path(self.cfg.dir) if self.cfg.dir else trainer.run_dir / "checkpoints"
        set_context(checkpoint_root=self.root)
        self.pending: PendingSave | None = None
        self._committer: threading.Thread | None = None
        self._commit_error: BaseException | None = None
        self.last_saved_step: int | None = None
        # A dedicated group keeps DCP's background collectives off FSDP's default group.
        self.group = dist.new_group(backend="gloo") if self.ctx.distributed and self.cfg.async_save else None

    def save(self, trainer: Trainer, reason: str) -> None:
        """Collective. Start (async) or complete (sync) a save of the current step.

        `blocking_s` in the event is everything the training loop waited for: the parameter digest,
        the rank-state write, staging (async) or the whole write and commit (sync).
        """
        step = trainer.state.step
        if step == self.last_saved_step:
            self.logs.event("checkpoint_skipped", step=step, reason=reason, why="already saved at this step")
            return
        self.wait()
        started = time.perf_counter()
        digest = param_digest(trainer.model, self.ctx)
        ckpt_dir = self.root / step_dir_name(step)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        fault_point("save:before-shards", step=step)
        write_rank_state(trainer, ckpt_dir)
        state = dcp_state(trainer)
        writer = _ShardWriter(ckpt_dir, step)
        if self.cfg.async_save:
            future = dcp.async_save(state, storage_writer=writer, process_group=self.group)
        else:
            dcp.save(state, storage_writer=writer)
            future = Future()
            future.set_result(None)
        self.last_saved_step = step
        self.pending = PendingSave(step, ckpt_dir, future, started, reason)
        if not self.cfg.async_save:
            self.wait()
        self.logs.event(
            "checkpoint_save",
            step=step,
            reason=reason,
            async_save=self.cfg.async_save,
            blocking_s=time.perf_counter() - started,
            param_digest=digest,
        )

    def poll(self) -> None:
        """Non-blocking: once the pending write is done on every rank, commit it in the background.

        Completion is agreed with a tiny all-reduce on the default group, from the main thread: the
        checkpoint group may still be busy with DCP's background collectives, and two threads issuing
        collectives on one group deadlock. Rank 0 then hashes and commits on a thread of its own, so
        the SHA-256 pass stays off the step path.
        """
        self._raise_commit_error()
        if self.pending is None:
            return
        done = self.pending.future.done()
        if self.ctx.distributed:
            flag = torch.tensor([1 if done else 0], dtype=torch.int64, device=self.ctx.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            done = bool(flag.item())
        if done:
            self._finish(background=True)

    def wait(self) -> None:
        """Block until the pending save is written and committed (and any background commit is done)."""
        if self.pending is not None:
            self._finish(background=False)
        if self._committer is not None:
            self._committer.join()
            self._committer = None
        self._raise_commit_error()

    def _finish(self, background: bool) -> None:
        assert self.pending is not None
        pending, self.pending = self.pending, None
        pending.future.result()  # re-raises a failed write loudly
        fault_point("save:after-shards", step=pending.step)
        self.logs.event(
            "checkpoint_written", step=pending.step, write_s=time.perf_counter() - pending.started
        )
        if not self.ctx.is_main:
            return
        if background:
            self._committer = threading.Thread(
                target=self._commit_guarded, args=(pending,), name="truestep-commit", daemon=True
            )
            self._committer.start()
        else:
            self._commit(pending)

    def _commit_guarded(self, pending: PendingSave) -> None:
        try:
            self._commit(pending)
        except BaseException as err:  # surfaced on the main thread by the next poll()/wait()
            self._commit_error = err

    def _raise_commit_error(self) -> None:
        if self._commit_error is not None:
            err, self._commit_error = self._commit_error, None
            raise RuntimeError(f"committing a checkpoint failed: {err}") from err

    def _commit(self, pending: PendingSave) -> None:
        started = time.perf_counter()
        if self.cfg.atomic_commit:
            fault_point("save:before-manifest", step=pending.step)
            manifest = write_manifest(pending.ckpt_dir, pending.step)
            fault_point("save:before-marker", step=pending.step)
            write_marker(pending.ckpt_dir, pending.step, manifest)
            fault_point("save:after-marker", step=pending.step)
        (self.root / LATEST).write_text(pending.ckpt_dir.name + "\n")  # a hint only
        self.logs.event("checkpoint_commit", step=pending.step, commit_s=time.perf_counter() - started)
        self._retain()

    def _retain(self) -> None:
        """Keep the newest keep_last_n committed checkpoints; never touch uncommitted ones."""
        keep = self.cfg.keep_last_n
        if keep <= 0:
            return
        complete = [d for d in step_dirs(self.root) if not self.cfg.atomic_commit or (d / MARKER).is_file()]
        for old in complete[keep:]:
            shutil.rmtree(old)
            self.logs.event("checkpoint_removed", step=step_of(old), reason=f"keep_last_n={keep}")
