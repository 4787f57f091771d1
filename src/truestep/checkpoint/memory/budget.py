"""What snapshots cost in host memory, stated at start and refused when it does not fit.

Per rank: its state (parameter shards, and the optimizer's: AdamW keeps two moments per parameter, in
fp32, and a step counter) times two slots (double buffering: the last agreed step stays while the next is
written) times (1 + the copies it holds for its buddies). Per host: the sum over its ranks. Available: the
free space of the snapshot directory's filesystem (tmpfs) and the host's MemAvailable, the smaller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from torch import nn
from torch.distributed.tensor import DTensor

GiB = 1 << 30


@dataclass(frozen=True)
class Budget:
    state_bytes: int
    """This rank's trajectory state in a snapshot (its shards and their optimizer state)."""
    copies: int
    """Copies this rank holds: its own and its buddies'."""
    ranks_on_host: int
    available: int
    """Bytes available to snapshots on this host (before the fraction)."""

    @property
    def per_rank(self) -> int:
        return 2 * self.copies * self.state_bytes

    @property
    def per_host(self) -> int:
        return self.per_rank * self.ranks_on_host

    def describe(self) -> str:
        return (
            f"2 slots x {self.copies} copies x {self.state_bytes / GiB:.2f} GiB per rank x {self.ranks_on_host} "
            f"rank(s) = {self.per_host / GiB:.2f} GiB on this host; {self.available / GiB:.2f} GiB available"
        )


def state_bytes(model: nn.Module) -> int:
    """This rank's parameter shards plus AdamW's state for them (two fp32 moments and a step each)."""
    total = 0
    for param in model.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        total += local.numel() * local.element_size() + 2 * local.numel() * 4 + 4
    for buffer in model.buffers():
        local = buffer.to_local() if isinstance(buffer, DTensor) else buffer
        total += local.numel() * local.element_size()
    return total


def available_bytes(directory: Path) -> int:
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    stats = os.statvfs(probe)
    free = stats.f_bavail * stats.f_frsize
    return min(free, _mem_available() or free)


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
