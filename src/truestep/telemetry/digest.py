"""A cheap parameter digest for the event log: SHA-256 over every rank's local shards, in rank order.

It is layout-dependent by design (no all-gather of full weights): two runs with the same layout have
equal digests iff every parameter shard is bit-identical.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from truestep.parallel.dist import DistContext


def local_digest(model: nn.Module) -> bytes:
    h = hashlib.sha256()
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        h.update(name.encode())
        h.update(local.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.digest()


def param_digest(model: nn.Module, ctx: DistContext) -> str:
    """Collective when distributed: every rank must call it. Returns the hex digest on every rank."""
    mine = torch.frombuffer(bytearray(local_digest(model)), dtype=torch.uint8).to(ctx.device)
    if not ctx.distributed:
        return hashlib.sha256(mine.cpu().numpy().tobytes()).hexdigest()
    gathered = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, mine)
    return hashlib.sha256(b"".join(g.cpu().numpy().tobytes() for g in gathered)).hexdigest()
