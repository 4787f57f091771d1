"""Process group and device-mesh set-up, backend choice, and clean teardown.

A run without torchrun-style environment variables is a single process with no process group at all.
"""

from __future__ import annotations

import enum
import sys
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from truestep.config.errors import ConfigError
from truestep.config.schema import JobConfig
from truestep.config.validate import validate_layout
from truestep.core.errors import end_process
from truestep.core.launch import Launch
from truestep.faults.hooks import fault_point


@dataclass
class DistContext:
    """Who this process is and which groups it talks through."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    """Ranks on this host (they share its memory)."""
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
    return broadcast_ints([value], ctx)[0]


def broadcast_ints(values: list[int], ctx: DistContext) -> list[int]:
    """Collective: rank 0's integers on every rank, in one broadcast (every rank passes as many)."""
    if not ctx.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.int64, device=ctx.device)
    dist.broadcast(t, src=0)
    return [int(v) for v in t.tolist()]


E = TypeVar("E", bound=enum.Enum)


def broadcast_choice(value: E, ctx: DistContext) -> E:
    """Collective: rank 0's member of an enum on every rank (sent as its position in the enum: a value
    crosses ranks as the enum it is, never as a sentinel integer or a sentence)."""
    members = list(type(value))
    return members[broadcast_int(members.index(value), ctx)]


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


def init_distributed(cfg: JobConfig, launch: Launch | None = None) -> DistContext:
    """Validate the layout against the world size first, then (if world > 1) build the 2-D mesh.
    `launch`: who this process is (default: its own launch record, core/launch.py)."""
    launch = launch if launch is not None else Launch.from_env()
    rank, world, local = launch.rank, launch.world_size, launch.local_rank
    dp, tp = validate_layout(cfg, world)
    torch.set_num_threads(cfg.parallel.num_threads)
    device = pick_device(cfg, local)
    if world == 1:
        return DistContext(device=device)
    backend = pick_backend(cfg, device)
    fault_point("rendezvous")
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
        local_world_size=launch.local_world_size,
        dp=dp,
        tp=tp,
        dp_rank=mesh["dp"].get_local_rank(),
        tp_rank=mesh["tp"].get_local_rank(),
        device=device,
        backend=backend,
        mesh=mesh,
    )


def leave(ctx: DistContext, clean: bool = True, debug: bool = False) -> None:
    """Leave the process group. A clean distributed exit barriers and destroys the group first;
    `clean=False` (an error some ranks may not share) skips the barrier, which could wait for a rank
    that left. A barrier that fails (a peer already gone) changes nothing about how this rank ended:
    its exit code says that already, so the failure is shown only with `truestep --debug`."""
    sys.stdout.flush()
    sys.stderr.flush()
    if not (ctx.distributed and clean):
        return
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001 - see the docstring: the exit code is already decided
        if debug:
            traceback.print_exception(err)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def shutdown(ctx: DistContext, exit_code: int = 0, clean: bool = True) -> NoReturn:
    """`leave`, then `end_process`: for scripts whose whole process is one rank (benchmarks)."""
    try:
        leave(ctx, clean)
    finally:
        end_process(exit_code)
