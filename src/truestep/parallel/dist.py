"""Process group and device-mesh set-up, backend choice, and clean teardown.

A run without torchrun-style environment variables is a single process with no process group at all.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from truestep.config.errors import ConfigError
from truestep.config.schema import JobConfig
from truestep.config.validate import validate_layout
from truestep.core.env import world_from_env


@dataclass
class DistContext:
    """Who this process is and which groups it talks through."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    dp: int = 1
    tp: int = 1
    dp_rank: int = 0
    tp_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "none"
    mesh: DeviceMesh | None = None

    @property
    def distributed(self) -> bool:
        return self.mesh is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def dp_group(self) -> dist.ProcessGroup | None:
        return self.mesh["dp"].get_group() if self.mesh is not None else None

    def layout(self) -> dict[str, int | str]:
        return {"world_size": self.world_size, "dp": self.dp, "tp": self.tp, "backend": self.backend}


def broadcast_int(value: int, ctx: DistContext) -> int:
    """Collective: rank 0's integer on every rank (an int64 tensor: never a pickled object)."""
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=ctx.device)
    dist.broadcast(t, src=0)
    return int(t.item())


def pick_device(cfg: JobConfig, local_rank: int) -> torch.device:
    want = cfg.parallel.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("parallel.device=cuda but CUDA is not available; use parallel.device=cpu")
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"local rank {local_rank} has no CUDA device (this node has {torch.cuda.device_count()}); "
                "launch at most one process per GPU"
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def pick_backend(cfg: JobConfig, device: torch.device) -> str:
    if cfg.parallel.backend != "auto":
        if cfg.parallel.backend == "nccl" and device.type != "cuda":
            raise ConfigError("parallel.backend=nccl needs parallel.device=cuda; use gloo on CPU")
        return cfg.parallel.backend
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(cfg: JobConfig) -> DistContext:
    """Validate the layout against the world size first, then (if world > 1) build the 2-D mesh."""
    rank, world, local = world_from_env()
    dp, tp = validate_layout(cfg, world)
    torch.set_num_threads(cfg.parallel.num_threads)
    device = pick_device(cfg, local)
    if world == 1:
        return DistContext(device=device)
    backend = pick_backend(cfg, device)
    dist.init_process_group(
        backend=backend,
        timeout=timedelta(seconds=cfg.parallel.init_timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    return DistContext(
        rank=rank,
        world_size=world,
        local_rank=local,
        dp=dp,
        tp=tp,
        dp_rank=mesh["dp"].get_local_rank(),
        tp_rank=mesh["tp"].get_local_rank(),
        device=device,
        backend=backend,
        mesh=mesh,
    )


def shutdown(ctx: DistContext, exit_code: int = 0, clean: bool = True) -> None:
    """Leave and exit. A clean distributed exit barriers and destroys the group first; `clean=False`
    (an error some ranks may not share) skips the barrier, which could wait for a rank that left.
    Then `os._exit`: a normal interpreter exit sometimes aborts in a C++ destructor after training
    finished ("terminate called without an active exception", seen under gloo and, rarely,
    single-process with DCP's background threads), turning a finished run into a failed one. Callers
    close their logs first."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if ctx.distributed and clean:
            dist.barrier()
            dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
