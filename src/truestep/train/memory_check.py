"""The memory check before the model is built (train.memory_check): estimate this rank's peak
(parallel/memory.py), log it, and refuse a job that the host (or the GPU) cannot hold.

Every rank estimates and compares with its own host's (or GPU's) available memory; one all-reduce tells
every rank the largest shortfall, so they refuse together (exit 2, one line from rank 0) instead of one
rank dying of an out-of-memory kill while its peers wait in a collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from truestep.config.errors import ConfigError
from truestep.config.schema import JobConfig
from truestep.parallel.dist import DistContext
from truestep.parallel.memory import (
    MemoryEstimate,
    available_bytes,
    estimate,
    gib,
    peak_bytes,
    return_freed_memory,
)
from truestep.telemetry.run_logs import RunLogs


def check_memory(cfg: JobConfig, ctx: DistContext, logs: RunLogs) -> MemoryEstimate:
    """Collective when distributed. Raises ConfigError when the estimate does not fit (train.memory_check)."""
    returned = ctx.device.type == "cpu" and cfg.parallel.cpu_return_freed_memory and return_freed_memory()
    est = estimate(cfg, ctx.dp, ctx.tp, ctx.device.type, ctx.local_world_size)
    # On a CPU host the ranks share its memory (the runtime of each included); a GPU is one rank's.
    need = est.peak * (est.ranks_per_host if ctx.device.type == "cpu" else 1)
    if ctx.device.type == "cpu":
        need -= est.runtime  # this rank's runtime is already resident, so MemAvailable excludes it
    available = available_bytes(ctx.device)
    shortfall = max(0, need - available) if available is not None else 0
    if ctx.distributed:
        t = torch.tensor([shortfall], dtype=torch.int64, device=ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        shortfall = int(t.item())
    logs.event(
        "memory_estimate",
        **est.as_fields(),
        available_bytes=available,
        host_need_bytes=need,
        activation_checkpointing=cfg.train.activation_checkpointing,
        fits=shortfall == 0,
        enforced=cfg.train.memory_check,
        returns_freed_memory=returned,
    )
    if shortfall and cfg.train.memory_check:
        where = "this host's available memory" if ctx.device.type == "cpu" else "the GPU's free memory"
        raise ConfigError(
            f"not enough memory: {est.line()}; x {est.ranks_per_host} rank(s) here needs {gib(need)}, "
            f"{gib(shortfall)} more than {where}"
            + (f" ({gib(available)})" if available is not None else "")
            + "; lower it with train.activation_checkpointing=full, a smaller train.micro_batch_size, "
            "more data-parallel ranks (FSDP shards parameters, gradients and optimizer state), or start "
            "anyway with train.memory_check=false"
        )
    return est


def peak_over_ranks(ctx: DistContext) -> int:
    """Collective when distributed: the largest peak any rank has reached so far (parallel/memory.py
    `peak_bytes`), for the step's metrics line (`peak_mem_bytes`)."""
    peak = peak_bytes(ctx.device)
    if not ctx.distributed:
        return peak
    t = torch.tensor([peak], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def peaks_per_rank(ctx: DistContext) -> list[int]:
    """Collective when distributed: every rank's peak so far, by rank (for run_end and the report)."""
    peak = peak_bytes(ctx.device)
    if not ctx.distributed:
        return [peak]
    mine = torch.tensor([peak], dtype=torch.int64, device=ctx.device)
    every = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(every, mine)
    return [int(t.item()) for t in every]
