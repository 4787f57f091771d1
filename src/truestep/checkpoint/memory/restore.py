"""Recovery from memory: the ranks of a restarted attempt restore the newest agreed snapshot every rank's
state can be found for -- a survivor from its own copy, a replaced rank (whose memory was lost with it)
from a buddy's copy sent over the process group -- each copy checked against its owner's SHA-256 before
a byte is loaded, the live model checked against the owner's model digest after.

Collective and decided identically on every rank from one all-gathered inventory (agreed step, and the
steps of the copies each rank holds): no rank decides alone, and no rank can go on to load while another
falls back. When memory cannot serve, `MemoryUnavailable` says why in one line and nothing was loaded,
or, when a check failed after loading began, the caller must start over (`touched`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from truestep.checkpoint.mechanisms import RestoreParts
from truestep.checkpoint.memory.holder import CopyHeader, Holder
from truestep.checkpoint.memory.payload import (
    PayloadMismatch,
    load_payload,
    map_file,
    model_digest,
    sha256_of,
    tensors_of,
    write_bytes,
)
from truestep.checkpoint.memory.replicate import (
    holders_of,
    owners_held_by,
    recv_header,
    recv_payload,
    send_copy,
    waiting,
)
from truestep.checkpoint.restored import DigestCheck, Restored, RestoreSource, RngPolicy
from truestep.checkpoint.state import Checkpointable, rank_state_from
from truestep.parallel.dist import DistContext
from truestep.telemetry import startup

NONE = -1


class MemoryUnavailable(Exception):
    """Memory cannot serve this restore (the message says why); `touched` when the state was changed."""

    def __init__(self, why: str, touched: bool = False, quiet: bool = False) -> None:
        super().__init__(why)
        self.touched = touched
        self.quiet = quiet
        """Nothing is held anywhere and nothing is on disk: a fresh run, unless earlier attempts logged
        steps (the restorer tells which; a run whose every memory was lost says so)."""


@dataclass(frozen=True)
class Plan:
    step: int
    sources: tuple[int, ...]
    """sources[r]: the rank whose copy rank r loads (r itself: its own)."""


def _usable(header: CopyHeader, identity: dict[str, Any]) -> bool:
    return header.identity == identity


def inventory(
    holder: Holder, ctx: DistContext, identity: dict[str, Any], owners: list[int], width: int
) -> list[int]:
    """This rank's row: agreed step, its own copies' steps (two slots), then two per owner it holds."""

    def steps(owner: int) -> list[int]:
        found = sorted(s for s, (_, h) in holder.copies(owner).items() if _usable(h, identity))[-2:]
        return ([NONE, NONE] + found)[-2:]

    agreed = holder.agreed()
    row = [agreed if agreed is not None else NONE, *steps(ctx.rank)]
    for owner in owners:
        row += steps(owner)
    return row + [NONE] * (width - len(row))


def gather_rows(row: list[int], ctx: DistContext) -> list[list[int]]:
    mine = torch.tensor(row, dtype=torch.int64)
    if not ctx.distributed:
        return [row]
    rows = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(rows, mine)
    return [r.tolist() for r in rows]


def plan(rows: list[list[int]], world: int, per_node: int, replicas: int, disk_newest: int) -> Plan:
    """The newest step no newer than any rank's agreed mark, newer than the disk's, whose every rank's
    state is held somewhere; MemoryUnavailable naming what is missing otherwise. Pure."""
    agreed = max(row[0] for row in rows)
    if agreed == NONE:
        nothing = all(v == NONE for row in rows for v in row)
        raise MemoryUnavailable(
            "no rank holds an agreed snapshot (none was taken yet, or the memory of every rank that held one "
            "was lost)",
            quiet=nothing and disk_newest < 0,  # a fresh run: nothing to say
        )
    if disk_newest >= agreed:
        raise MemoryUnavailable(
            f"the newest committed checkpoint (step {disk_newest}) is not older than the last agreed snapshot "
            f"(step {agreed})"
        )
    held: dict[tuple[int, int], set[int]] = {}  # (owner, holder) -> steps
    for rank, row in enumerate(rows):
        held[(rank, rank)] = set(row[1:3]) - {NONE}
        for index, owner in enumerate(owners_held_by(rank, world, per_node, replicas)):
            held[(owner, rank)] = set(row[3 + 2 * index : 5 + 2 * index]) - {NONE}
    steps = sorted({s for found in held.values() for s in found if disk_newest < s <= agreed}, reverse=True)
    missing = f"no copy of any rank's state newer than step {disk_newest} is held"
    for step in steps:
        sources: list[int] = []
        for owner in range(world):
            candidates = [owner, *holders_of(owner, world, per_node, replicas)]
            source = next((h for h in candidates if step in held.get((owner, h), set())), None)
            if source is None:
                lost = ", ".join(str(h) for h in candidates)
                missing = (
                    f"rank {owner}'s state at step {step} is held nowhere (its own memory and its buddies' "
                    f"copies, ranks {lost}, were lost or never agreed)"
                )
                break
            sources.append(source)
        else:
            return Plan(step, tuple(sources))
    raise MemoryUnavailable(missing)


def restore_from_memory(
    states: Checkpointable,
    ctx: DistContext,
    holder: Holder,
    identity: dict[str, Any],
    parts: RestoreParts,
    per_node: int,
    replicas: int,
    disk_newest: int,
) -> tuple[Restored, dict[str, Any]]:
    """Collective. The restore, and facts for its event (sources, bytes moved, phases)."""
    began = time.perf_counter()
    world = ctx.world_size
    owners = owners_held_by(ctx.rank, world, per_node, replicas)
    width = 3 + 2 * max((len(owners_held_by(r, world, per_node, replicas)) for r in range(world)), default=0)
    with startup.timed("verify"):  # run_start's startup_phases: finding and checking the copies
        chosen = plan(
            gather_rows(inventory(holder, ctx, identity, owners, width), ctx),
            world,
            per_node,
            replicas,
            disk_newest,
        )
        data, header, moved = _fetch(chosen, holder, ctx)
        _agree(
            data is not None, ctx, "a snapshot copy failed its SHA-256 check or did not arrive", touched=False
        )
    assert data is not None and header is not None
    verified_s = time.perf_counter() - began
    ok = True
    with startup.timed("load"):
        try:
            _load(states, data, header, parts)
        except (PayloadMismatch, KeyError, TypeError, ValueError, IndexError):  # a header that does not fit
            ok = False
    _agree(ok, ctx, "a snapshot did not fit the rank's state", touched=True)
    with startup.timed("verify"):
        restored_model = model_digest(tensors_of(states.dcp_state_dict(with_optimizer=False)))
    _agree(
        restored_model == header.param_digest, ctx, "the restored model is not the one captured", touched=True
    )
    if chosen.sources[ctx.rank] != ctx.rank:  # a replaced rank: the copy it received is its own now
        holder.ensure()
        slot = holder.slot_for(ctx.rank, None)
        write_bytes(holder.begin(ctx.rank, slot), data)
        holder.commit(slot, header)
    holder.forget_except(chosen.step)  # anything else is another timeline's
    restored = Restored(
        step=chosen.step,
        source=RestoreSource.MEMORY,
        path=f"memory snapshot of step {chosen.step}",
        layout_changed=False,
        saved_layout=identity.get("layout", {}),
        rng_policy=RngPolicy.RESTORED if parts.rng else RngPolicy.FRESH_SEED,
        config_differences=(),
        weights=True,
        optimizer=parts.optimizer,
        data_position=parts.data_position,
        digest=DigestCheck.MATCHES,
        param_digest=states.param_digest(),
        saved_param_digest=None,
        saved_reason="snapshot",
        optimizer_proven=parts.optimizer,
        restore_s=time.perf_counter() - began,
    )
    facts = {
        "sources": {str(r): s for r, s in enumerate(chosen.sources)},
        "from_buddies": [r for r, s in enumerate(chosen.sources) if s != r],
        "bytes_received": moved,
        "verify_s": verified_s,
    }
    return restored, facts


def _fetch(
    chosen: Plan, holder: Holder, ctx: DistContext
) -> tuple[np.ndarray | None, CopyHeader | None, int]:
    """This rank's copy, verified: its own from its memory, or a buddy's sent over the default group.
    Also sends the copies this rank is the source of. (None, None, n) when its copy failed the check."""
    mine: tuple[np.ndarray | None, CopyHeader | None] = (None, None)
    moved = 0
    source = chosen.sources[ctx.rank]
    if source == ctx.rank:
        mine = _own(holder, ctx.rank, chosen.step)
    for owner, giver in enumerate(chosen.sources):  # the same order on every rank: sends meet receives
        if giver == owner:
            continue
        if ctx.rank == giver:
            held = holder.copies(owner).get(chosen.step)  # gone since the inventory: say so, never hang
            dist.send(torch.tensor([int(held is not None)], dtype=torch.int64), owner)
            if held is not None:
                slot, header = held
                with waiting(
                    send_copy(header, map_file(holder.payload(owner, slot), header.nbytes), owner, None)
                ):
                    pass
        elif ctx.rank == owner:
            status = torch.zeros(1, dtype=torch.int64)
            dist.recv(status, giver)
            if int(status.item()):
                header = recv_header(giver, None)
                buffer = torch.empty(header.nbytes, dtype=torch.uint8)
                recv_payload(buffer, giver, None)
                moved += header.nbytes
                data = buffer.numpy()
                ok = header.owner == owner and header.step == chosen.step and sha256_of(data) == header.sha256
                mine = (data, header) if ok else (None, None)
    return mine[0], mine[1], moved


def _own(holder: Holder, rank: int, step: int) -> tuple[np.ndarray | None, CopyHeader | None]:
    held = holder.copies(rank).get(step)
    if held is None:
        return None, None
    slot, header = held
    data = map_file(holder.payload(rank, slot), header.nbytes)
    return (data, header) if sha256_of(data) == header.sha256 else (None, None)


def _agree(ok: bool, ctx: DistContext, why: str, touched: bool) -> None:
    """Collective: every rank goes on only if every rank's part succeeded."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    if ctx.distributed:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if not int(flag.item()):
        raise MemoryUnavailable(why, touched)


def _load(states: Checkpointable, data: np.ndarray, header: CopyHeader, parts: RestoreParts) -> None:
    state = states.dcp_state_dict(with_optimizer=parts.optimizer)
    load_payload(data, header.table, tensors_of(state))
    states.load_dcp_state_dict(state)
    rank_state = rank_state_from(header.rank_state)
    policy = RngPolicy.RESTORED if parts.rng else RngPolicy.FRESH_SEED
    states.load_rank_state(rank_state, data_position=parts.data_position, rng=policy)
