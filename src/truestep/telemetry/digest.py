"""Cheap parameter (and optimizer state) digests for the event log: SHA-256 over every rank's local
shards, in rank order.

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


def _update(h: hashlib._Hash, name: str, tensor: torch.Tensor) -> None:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    h.update(name.encode())
    h.update(local.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def local_digest(model: nn.Module) -> bytes:
    h = hashlib.sha256()
    for name, param in model.named_parameters():
        _update(h, name, param)
    return h.digest()


def local_optimizer_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> bytes:
    """This rank's optimizer state (every moment and step counter of every parameter, in parameter
    order); a parameter without state (a fresh optimizer) hashes its name alone."""
    h = hashlib.sha256()
    for name, param in model.named_parameters():
        h.update(name.encode())
        for key, value in sorted(optimizer.state.get(param, {}).items()):
            if isinstance(value, torch.Tensor):
                _update(h, f"{name}.{key}", value)
            else:
                h.update(f"{name}.{key}={value!r}".encode())
    return h.digest()


def param_digest(model: nn.Module, ctx: DistContext) -> str:
    """Collective when distributed: every rank must call it. Returns the hex digest on every rank."""
    return gather_digest(local_digest(model), ctx)


def optimizer_digest(model: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext) -> str:
    """Collective, like param_digest, over the optimizer state: layout-dependent, equal iff every rank's
    moments are bit-identical."""
    return gather_digest(local_optimizer_digest(model, optimizer), ctx)


def gather_digest(local: bytes, ctx: DistContext) -> str:
    """Collective: every rank's local digest, in rank order, hashed into one hex digest."""
    mine = torch.frombuffer(bytearray(local), dtype=torch.uint8).to(ctx.device)
    if not ctx.distributed:
        return hashlib.sha256(mine.cpu().numpy().tobytes()).hexdigest()
    gathered = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, mine)
    return hashlib.sha256(b"".join(g.cpu().numpy().tobytes() for g in gathered)).hexdigest()
