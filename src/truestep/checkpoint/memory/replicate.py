"""Who holds whose copy, and moving copies between ranks.

A rank's buddies are the ranks `stride` apart (the ranks of one node are `stride` = ranks per node apart
from the same slot on the next node, so with several nodes a buddy is always on another node), one per
replica, never itself; capped at world_size - 1. Copies travel as a header (its length first) then the
payload, over a gloo group of their own in the background, or over the default group during a restore.
Every received payload is checked against the SHA-256 its owner computed before it is kept or used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist

from truestep.checkpoint.memory.holder import CopyHeader


def holders_of(owner: int, world: int, per_node: int, replicas: int) -> list[int]:
    """The ranks that hold a copy of `owner`'s snapshot, in order of preference."""
    stride = per_node if world > per_node > 0 else 1
    found: list[int] = []
    step = 1
    while len(found) < min(replicas, world - 1) and step < 2 * world:
        for candidate in ((owner + step * stride) % world, (owner + step) % world):
            if candidate != owner and candidate not in found and len(found) < replicas:
                found.append(candidate)
                break
        step += 1
    return found


def owners_held_by(holder: int, world: int, per_node: int, replicas: int) -> list[int]:
    return [o for o in range(world) if holder in holders_of(o, world, per_node, replicas)]


def as_tensor(data: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(data) if len(data) else torch.zeros(0, dtype=torch.uint8)


def send_copy(header: CopyHeader, payload: np.ndarray, to: int, group: dist.ProcessGroup | None) -> list:
    """Post the sends of one copy; the caller waits on what is returned."""
    blob = np.frombuffer(header.to_json(), dtype=np.uint8).copy()
    works = [
        dist.isend(torch.tensor([len(blob)], dtype=torch.int64), to, group=group),
        dist.isend(torch.from_numpy(blob), to, group=group),
    ]
    if header.nbytes:
        works.append(dist.isend(as_tensor(payload), to, group=group))
    return works


def recv_header(source: int, group: dist.ProcessGroup | None) -> CopyHeader:
    length = torch.zeros(1, dtype=torch.int64)
    dist.recv(length, source, group=group)
    blob = torch.zeros(int(length.item()), dtype=torch.uint8)
    dist.recv(blob, source, group=group)
    return CopyHeader.parse(blob.numpy().tobytes())


def recv_payload(into: torch.Tensor, source: int, group: dist.ProcessGroup | None) -> None:
    if into.numel():
        dist.recv(into, source, group=group)


@contextmanager
def waiting(works: list) -> Iterator[list]:
    """Every posted send is waited for, whatever happens in between."""
    try:
        yield works
    finally:
        for work in works:
            work.wait()
