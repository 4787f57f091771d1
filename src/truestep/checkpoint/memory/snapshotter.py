"""Taking snapshots: at a step boundary every `every` steps each rank copies its whole trajectory state into
its host memory and sends a copy to its buddies, in the background; at the next step boundary the ranks
agree that the step is held everywhere.

The copy reads the live tensors (no staged copy), so the next optimizer step waits until the copy is
taken (`wait_captured`, from an optimizer step pre-hook): the forward and backward of that step overlap
it, the update does not. The copies to buddies overlap the same step. `agree` then waits for this rank's
part to be done and all-reduces the result: a step every rank holds (its own copy and every copy it is a
buddy for, each checked against its owner's SHA-256) is agreed, written in each holder, and the previous
agreed step stays in the other slot until then (double buffering).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from truestep.checkpoint.memory.holder import CopyHeader, Holder
from truestep.checkpoint.memory.payload import map_file, sha256_of, table_of, tensors_of, write_payload
from truestep.checkpoint.memory.replicate import (
    holders_of,
    owners_held_by,
    recv_header,
    recv_payload,
    send_copy,
    waiting,
)
from truestep.checkpoint.state import Checkpointable
from truestep.faults.hooks import fault_point
from truestep.parallel.dist import DistContext
from truestep.telemetry.run_logs import RunLogs


@dataclass
class _Pending:
    step: int
    captured: threading.Event
    done: Future
    started: float
    capture_s: float = 0.0
    replicate_s: float = 0.0
    nbytes: int = 0
    wait_s: float = 0.0
    """How long the optimizer update waited for the capture: the part of a snapshot's cost inside a step."""


class Snapshotter:
    def __init__(
        self,
        states: Checkpointable,
        ctx: DistContext,
        holder: Holder,
        identity: dict[str, Any],
        every: int,
        replicas: int,
        per_node: int,
        logs: RunLogs,
    ) -> None:
        self.states = states
        self.ctx = ctx
        self.holder = holder
        self.identity = identity
        self.every = every
        self.holders = holders_of(ctx.rank, ctx.world_size, per_node, replicas)
        self.owners = owners_held_by(ctx.rank, ctx.world_size, per_node, replicas)
        self.logs = logs
        self.pending: _Pending | None = None
        self.agreed: int | None = holder.agreed()
        # Copies travel on a group of their own: the default group is the training step's.
        self.group = dist.new_group(backend="gloo") if ctx.distributed else None
        holder.ensure()

    # --- the step path -----------------------------------------------------------------------------

    def after_step(self, step: int) -> None:
        """Collective. Agree on the snapshot in flight, then start this step's when it is due."""
        if self.pending is not None:
            self.agree()
        if step % self.every == 0:
            self._start(step)

    def wait_captured(self) -> None:
        """Before an optimizer step: the copy of the state it is about to change must be taken."""
        pending = self.pending
        if pending is not None and not pending.captured.is_set():
            began = time.perf_counter()
            pending.captured.wait()
            pending.wait_s += time.perf_counter() - began

    def agree(self) -> None:
        """Collective: this rank's part done, then every rank's (a MIN all-reduce of the step held)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        began = time.perf_counter()
        error = pending.done.exception()
        held = pending.step if error is None else -1
        if self.ctx.distributed:
            t = torch.tensor([held], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            held = int(t.item())
        timing = {
            "capture_s": pending.capture_s,
            "replicate_s": pending.replicate_s,
            "blocked_s": time.perf_counter() - began,
            "wait_s": pending.wait_s,
            "bytes": pending.nbytes,
        }
        if held == pending.step:
            self.agreed = pending.step
            self.holder.set_agreed(pending.step)
            self.logs.event("snapshot_agreed", step=pending.step, holders=self.holders, **timing)
        else:
            why = f"{type(error).__name__}: {error}" if error is not None else "another rank's part failed"
            self.logs.event("snapshot_failed", step=pending.step, error=why, agreed=self.agreed, **timing)

    def close(self, timeout: float = 10.0) -> None:
        """Let the copy in flight finish, without agreeing. Bounded: after a failure a buddy may never
        answer, and the thread (a daemon) must not keep the rank from returning."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.captured.wait(timeout)
            try:
                pending.done.exception(timeout)
            except TimeoutError:
                self.logs.event("snapshot_abandoned", step=pending.step, after_s=timeout)

    # --- the background ----------------------------------------------------------------------------

    def _start(self, step: int) -> None:
        state = self.states.dcp_state_dict(with_optimizer=True)  # views of the live tensors
        rank_state = self.states.rank_state()  # JSON: counters, data position, RNG, as of this boundary
        slot = self.holder.slot_for(self.ctx.rank, self.agreed)
        pending = _Pending(step, threading.Event(), Future(), time.perf_counter())
        self.pending = pending
        work = threading.Thread(
            target=self._work,
            args=(pending, state, vars(rank_state), slot),
            name="truestep-snapshot",
            daemon=True,
        )
        work.start()

    def _work(self, pending: _Pending, state: dict[str, Any], rank_state: dict[str, Any], slot: int) -> None:
        try:
            own = self._capture(pending, state, rank_state, slot)
        except BaseException as err:  # told at the agreement; the optimizer must not wait forever
            pending.captured.set()
            pending.done.set_exception(err)
            return
        pending.captured.set()
        try:
            began = time.perf_counter()
            self._replicate(own, slot)
            pending.replicate_s = time.perf_counter() - began
        except BaseException as err:
            pending.done.set_exception(err)
            return
        pending.done.set_result(None)

    def _capture(
        self, pending: _Pending, state: dict[str, Any], rank_state: dict[str, Any], slot: int
    ) -> CopyHeader:
        tensors = tensors_of(state)
        table, nbytes = table_of(tensors)
        # From the views taken at the step boundary, never model.parameters(): FSDP2 swaps unsharded
        # parameters in during the forward this overlaps.
        sha256, model_sha256 = write_payload(self.holder.begin(self.ctx.rank, slot), tensors)
        header = CopyHeader(
            owner=self.ctx.rank,
            step=pending.step,
            nbytes=nbytes,
            sha256=sha256,
            param_digest=model_sha256,
            identity=self.identity,
            table=table,
            rank_state=rank_state,
        )
        self.holder.commit(slot, header)
        pending.capture_s = time.perf_counter() - pending.started
        pending.nbytes = nbytes
        return header

    def _replicate(self, own: CopyHeader, slot: int) -> None:
        """Send this rank's copy to its buddies and keep the copies of the ranks it is a buddy of."""
        fault_point("snapshot:replicating", step=own.step)
        if not self.ctx.distributed:
            return
        payload = map_file(self.holder.payload(own.owner, slot), own.nbytes)
        with waiting([w for to in self.holders for w in send_copy(own, payload, to, self.group)]):
            for owner in self.owners:
                header = recv_header(owner, self.group)
                if header.owner != owner or header.step != own.step:
                    raise RuntimeError(f"rank {owner} sent a copy of rank {header.owner} step {header.step}")
                keep = self.holder.slot_for(owner, self.agreed)
                into = _file_tensor(self.holder.begin(owner, keep), header.nbytes)
                recv_payload(into, owner, self.group)
                got = sha256_of(into.numpy())
                if got != header.sha256:
                    raise RuntimeError(
                        f"the copy of rank {owner} step {header.step} arrived with another SHA-256"
                    )
                self.holder.commit(keep, header)


def _file_tensor(path: Any, nbytes: int) -> torch.Tensor:
    """A uint8 tensor backed by a new file at `path` (shared mapping: what is written lands in the file)."""
    import os

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    if nbytes == 0:
        return torch.zeros(0, dtype=torch.uint8)
    return torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
