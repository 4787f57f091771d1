"""Saving: shards via DCP (sync or async), then the commit on rank 0 once every rank's write is done.

Order inside one save (docs/checkpointing.md):
  1. every rank writes its rank-state JSON (temp + fsync + rename);
  2. DCP writes every rank's shards and the `.metadata` (fsynced by the writer); with async save this
     overlaps training and runs on its own gloo group, because sharing the default group with FSDP's
     collectives can deadlock; meanwhile rank 0 writes the save record (`save.json`: step, reason and
     the parameter digest every rank's shards were hashed into, checkpoint/save_record.py);
  3. when DCP has finished on all ranks (its future resolves only after the coordinator gathered every
     rank's write results and wrote `.metadata`), rank 0 writes manifest.json (version 3: each rank
     wrote its own manifest shard of the item digests it computed while writing; rank 0 lists the files,
     the shards' SHA-256 and hashes the few small files it wrote itself, `.metadata` and `save.json`;
     nothing else is read back) and then COMMITTED (the commit protocol: checkpoint/commit_protocol.py).
A crash anywhere before 3 completes leaves a directory without a valid marker: never resumed from.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from truestep.checkpoint.catalog import (
    LATEST,
    quarantined_past,
    set_aside_step,
    step_dir_name,
)
from truestep.checkpoint.commit_protocol import Publication
from truestep.checkpoint.manifest_shards import ShardRecord
from truestep.checkpoint.mechanisms import Mechanisms, choose
from truestep.checkpoint.ownership import marker_identity, newer_own_commit, own_committed
from truestep.checkpoint.safe_dcp import silence_single_process_saves, single_process
from truestep.checkpoint.save_record import SaveRecord, write_save_record
from truestep.checkpoint.shard_writer import ShardWriter
from truestep.checkpoint.state import Checkpointable, write_rank_state
from truestep.checkpoint.unstaged import mutate_in_place
from truestep.config.schema import CheckpointConfig
from truestep.core.errors import FencedError, os_error_line, storage_error
from truestep.core.fsio import atomic_write, make_dir
from truestep.faults.hooks import fault_point
from truestep.parallel.dist import DistContext
from truestep.telemetry.digest import gather_digest
from truestep.telemetry.run_logs import RunLogs


@contextmanager
def _writing(ckpt_dir: Path) -> Iterator[None]:
    """A write the filesystem refuses (full disk, quota, read-only) as a StorageError saying where: DCP
    reports it as a CheckpointException whose OSError carries no file name."""
    try:
        yield
    except BaseException as err:
        storage = storage_error(err, f"writing checkpoint {ckpt_dir}")
        if storage is not None:
            raise storage from err
        raise


@dataclass
class PendingSave:
    step: int
    ckpt_dir: Path
    future: Future
    started: float
    reason: str
    writer: ShardWriter


class Checkpointer:
    """Saves and commits the checkpoints of one attempt into `root`.

    `fence` raises FencedError once this attempt no longer owns the run directory; it is called right
    before a commit marker is published, so a stale writer can never publish a checkpoint.
    """

    def __init__(
        self,
        root: Path,
        cfg: CheckpointConfig,
        ctx: DistContext,
        logs: RunLogs,
        trajectory_keys: dict[str, Any],
        fence: Callable[[], None],
        incarnation: int,
        run_id: str = "",
        mechanisms: Mechanisms | None = None,
    ) -> None:
        self.root = root
        self.cfg = cfg
        self.ctx = ctx
        self.logs = logs
        self.trajectory_keys = trajectory_keys
        self.fence = fence
        self.incarnation = incarnation
        self.run_id = run_id
        """The run directory's identity (its lease's): markers record it; see checkpoint/ownership.py."""
        self.mechanisms = mechanisms or choose(cfg)
        """The variants this rank saves with (checkpoint/mechanisms.py); chosen from `cfg` when not given."""
        self.pending: PendingSave | None = None
        self._committer: threading.Thread | None = None
        self._commit_error: BaseException | None = None
        self.last_saved_step: int | None = None
        # A dedicated group keeps DCP's background collectives off FSDP's default group.
        async_write = self.mechanisms.write.is_async
        self.group = dist.new_group(backend="gloo") if self.ctx.distributed and async_write else None
        if not self.ctx.distributed:
            silence_single_process_saves()

    def save(self, step: int, states: Checkpointable, reason: str, local_digest: Callable[[], bytes]) -> None:
        """Collective. Start (async) or complete (sync) a save of the current step.

        `local_digest` hashes this rank's parameter shards; it runs on a thread beside the rank-state
        write and the staging copy (all three only read the state, and hashing and copying release the
        GIL), then the ranks gather it into the `param_digest` of the event. `blocking_s` in the event is
        everything the training loop waited for from the call on: the previous save's completion, the
        digest, the rank-state write, staging (async) or the whole write and commit (sync).
        """
        if step == self.last_saved_step:
            self.logs.event("checkpoint_skipped", step=step, reason=reason, why="already saved at this step")
            return
        started = time.perf_counter()
        self.wait()
        hashing = _on_thread(local_digest)
        ckpt_dir = self.root / step_dir_name(step)
        make_dir(ckpt_dir)
        fault_point("save:before-shards", step=step)
        write_rank_state(ckpt_dir, self.ctx, states.rank_state(), self.trajectory_keys)
        state = states.dcp_state_dict(with_optimizer=True)
        writer = ShardWriter(ckpt_dir, step)
        with single_process(), _writing(ckpt_dir):  # one process saves without a process group on purpose
            future, release = self.mechanisms.write.start(state, writer, self.group)
        param_digest = gather_digest(hashing.result(), self.ctx)  # before anything may change the state
        if self.ctx.is_main:  # in the checkpoint: what its restore is checked against (save_record.py)
            write_save_record(ckpt_dir, SaveRecord(step, reason, param_digest))
        # A `mutate` fault: the saved tensors change while the (async) write may still be reading them.
        fault_point("save:writing", step=step, mutate=lambda: mutate_in_place(state))
        release()
        self.last_saved_step = step
        self.pending = PendingSave(step, ckpt_dir, future, started, reason, writer)
        if not self.mechanisms.write.is_async:
            self.wait()
        self.logs.event(
            "checkpoint_save",
            step=step,
            reason=reason,
            async_save=self.mechanisms.write.is_async,
            blocking_s=time.perf_counter() - started,
            param_digest=param_digest,
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

    def join_commit(self) -> None:
        """Rank-local, no collective: let a background commit already under way finish (a save still being
        written stays pending). For what must see the commits this process has started, e.g. the
        `corrupt` fault's "newest committed checkpoint", which otherwise raced the commit thread."""
        if self._committer is not None:
            self._committer.join()

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
        with _writing(pending.ckpt_dir):
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
            if isinstance(err, FencedError):
                raise err
            storage = storage_error(err, "committing a checkpoint")
            if storage is not None:
                raise storage from err
            raise RuntimeError(f"committing a checkpoint failed: {err}") from err

    def _check_fence(self) -> None:
        """Refuse to publish if a newer attempt owns the run directory or committed after us."""
        self.fence()
        newer = newer_own_commit(self.root, self.run_id, self.incarnation)  # copied ones never count
        if newer is not None:
            raise FencedError(
                f"{newer[0].name} was committed by attempt {newer[1]}, newer than this attempt "
                f"({self.incarnation}); not publishing an older attempt's checkpoint"
            )

    @staticmethod
    def _digests(pending: PendingSave) -> list[ShardRecord]:
        """Every rank's manifest-shard record, gathered by DCP to this (the coordinator's) writer."""
        if pending.writer.digests is None:
            raise RuntimeError(f"not committing {pending.ckpt_dir}: DCP never finished its storage writer")
        return pending.writer.digests

    def _commit(self, pending: PendingSave) -> None:
        started = time.perf_counter()
        self.mechanisms.commit.publish(
            Publication(
                pending.ckpt_dir,
                pending.step,
                lambda: self._digests(pending),
                self._check_fence,
                marker_identity(self.run_id, self.incarnation),
                self.incarnation,
            )
        )
        atomic_write(self.root / LATEST, (pending.ckpt_dir.name + "\n").encode())  # a hint only
        self.logs.event("checkpoint_commit", step=pending.step, commit_s=time.perf_counter() - started)
        self._retain()

    def _retain(self) -> None:
        """Keep the newest keep_last_n committed checkpoints (never touch uncommitted ones) and the newest
        keep_quarantined quarantined ones: the step just committed is newer than any of them."""
        self._remove(quarantined_past(self.root, self.cfg.keep_quarantined), "keep_quarantined")
        if self.cfg.keep_last_n > 0:
            # Only this run's own: a checkpoint copied from another run directory is read-only to us.
            self._remove(own_committed(self.root, self.run_id)[self.cfg.keep_last_n :], "keep_last_n")

    def _remove(self, dirs: list[Path], rule: str) -> None:
        keep = getattr(self.cfg, rule)
        for old in dirs:
            try:
                shutil.rmtree(old)
            except OSError as err:  # e.g. swapped for a symlink meanwhile: keep training, say so
                why = os_error_line(err, f"could not remove {old.name} ({rule}={keep})")
                self.logs.event("checkpoint_remove_failed", step=set_aside_step(old), error=why)
                print(f"truestep train: warning: {why}", file=sys.stderr, flush=True)
                continue
            self.logs.event(
                "checkpoint_removed", step=set_aside_step(old), reason=f"{rule}={keep}", name=old.name
            )


def _on_thread(work: Callable[[], bytes]) -> Future[bytes]:
    """`work()` on a thread of its own; its result (or its exception) through the future."""
    done: Future[bytes] = Future()

    def run() -> None:
        try:
            done.set_result(work())
        except BaseException as err:  # handed to the caller by done.result()
            done.set_exception(err)

    threading.Thread(target=run, name="truestep-param-digest", daemon=True).start()
    return done
