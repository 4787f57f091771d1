"""Global gradient norm and clipping that are correct for any mix of FSDP and TP shards.

Each rank holds some gradient shards; a shard replicated on r ranks is counted 1/r times so the
all-reduced sum of squares equals that of the full, unsharded gradient.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from truestep.parallel.dist import DistContext


def _local_and_replication(grad: torch.Tensor, world_size: int) -> tuple[torch.Tensor, int]:
    if isinstance(grad, DTensor):
        mesh = grad.device_mesh
        # Anything but Replicate splits the tensor: Shard, and FSDP's _StridedShard on a TP-sharded dim
        # (which is not a Shard subclass). Partial never reaches here: gradients are reduced by then.
        distinct = math.prod(
            mesh.size(dim) for dim, placement in enumerate(grad.placements) if not placement.is_replicate()
        )
        return grad.to_local(), world_size // distinct
    return grad, world_size


@torch.no_grad()
def global_grad_norm(params: Iterable[torch.nn.Parameter], ctx: DistContext) -> torch.Tensor:
    """L2 norm of all gradients as if unsharded; the same value on every rank."""
    by_replication: dict[int, torch.Tensor] = {}
    for param in params:
        if param.grad is None:
            continue
        local, replication = _local_and_replication(param.grad, ctx.world_size)
        sq = local.float().pow(2).sum()
        by_replication[replication] = by_replication.get(replication, 0) + sq
    total = torch.zeros((), dtype=torch.float32, device=ctx.device)
    for replication in sorted(by_replication):
        total += by_replication[replication] / replication
    if ctx.distributed:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.sqrt()


@torch.no_grad()
def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float, ctx: DistContext) -> torch.Tensor:
    """Scale gradients so their global norm is at most `max_norm` (0 = measure only)."""
    norm = global_grad_norm(params, ctx)
    if max_norm > 0:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for param in params:
            if param.grad is not None:
                local, _ = _local_and_replication(param.grad, ctx.world_size)
                local.mul_(coef)
    return norm
