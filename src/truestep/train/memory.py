"""The memory path of one rank (resilience.snapshot_every_steps > 0): where its snapshot memory is, what it
costs (refused at start when it does not fit), and its two uses -- the snapshots the hook takes
(train/hooks/snapshot.py) and the restore the restorer tries before the disk (train/restorer.py).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from truestep.checkpoint.mechanisms import RestoreParts
from truestep.checkpoint.memory.budget import Budget, available_bytes, state_bytes
from truestep.checkpoint.memory.holder import Holder, forget_holder
from truestep.checkpoint.memory.replicate import holders_of, owners_held_by
from truestep.checkpoint.memory.restore import restore_from_memory
from truestep.checkpoint.memory.snapshotter import Snapshotter
from truestep.checkpoint.restored import Restored
from truestep.config.errors import ConfigError
from truestep.config.fingerprint import fingerprint
from truestep.core.names import SNAPSHOT_ROOT_DEFAULT, snapshot_holder_dir
from truestep.train.trainer import Trainer


class MemoryPath:
    def __init__(self, trainer: Trainer, run_id: str, per_node: int) -> None:
        r = trainer.cfg.resilience
        ctx = trainer.ctx
        self.trainer = trainer
        self.every = r.snapshot_every_steps
        self.per_node = max(1, per_node)
        self.replicas = min(r.snapshot_replicas, max(ctx.world_size - 1, 0))
        self.root = Path(r.snapshot_dir or SNAPSHOT_ROOT_DEFAULT)
        self.holder = Holder(snapshot_holder_dir(self.root, run_id, socket.gethostname(), ctx.rank))
        self.identity: dict[str, Any] = {
            "run_id": run_id,
            "fingerprint": fingerprint(trainer.trajectory_keys),
            "layout": ctx.layout(),
        }
        self.budget = self._check_budget(r.snapshot_memory_fraction)
        self.snapshotter: Snapshotter | None = None

    def _check_budget(self, fraction: float) -> Budget:
        """Collective: every rank refuses if any host's snapshots would not fit (one line, exit 2)."""
        ctx = self.trainer.ctx
        copies = 1 + len(owners_held_by(ctx.rank, ctx.world_size, self.per_node, self.replicas))
        ranks_here = min(self.per_node, ctx.world_size)
        budget = Budget(state_bytes(self.trainer.model), copies, ranks_here, available_bytes(self.root))
        fits = torch.tensor([int(budget.per_host <= fraction * budget.available)], dtype=torch.int64)
        if ctx.distributed:
            dist.all_reduce(fits, op=dist.ReduceOp.MIN)
        self.trainer.logs.event(
            "snapshot_budget",
            state_bytes=budget.state_bytes,
            copies=copies,
            per_rank_bytes=budget.per_rank,
            per_host_bytes=budget.per_host,
            available_bytes=budget.available,
            replicas=self.replicas,
            holders=holders_of(ctx.rank, ctx.world_size, self.per_node, self.replicas),
        )
        if not int(fits.item()):
            raise ConfigError(
                f"resilience.snapshot_every_steps={self.every}: snapshots do not fit host memory ("
                f"{budget.describe()} on rank {ctx.rank}'s host, snapshot_memory_fraction={fraction:g}); "
                "lower snapshot_replicas, raise snapshot_every_steps' memory (snapshot_dir on a larger tmpfs) "
                "or turn snapshots off (0)"
            )
        if self.replicas == 0 and ctx.is_main:
            self.trainer.logs.event("snapshot_without_buddies", reason="one rank: no peer to hold a copy")
        return budget

    def start_snapshots(self) -> Snapshotter:
        trainer = self.trainer
        self.snapshotter = Snapshotter(
            trainer,
            trainer.ctx,
            self.holder,
            self.identity,
            self.every,
            self.replicas,
            self.per_node,
            trainer.logs,
        )
        return self.snapshotter

    def restore(self, parts: RestoreParts, disk_newest: int) -> tuple[Restored, dict[str, Any]]:
        """Collective (checkpoint/memory/restore.py); raises MemoryUnavailable saying why not."""
        return restore_from_memory(
            self.trainer,
            self.trainer.ctx,
            self.holder,
            self.identity,
            parts,
            self.per_node,
            self.replicas,
            disk_newest,
        )

    def release(self) -> None:
        """The run is over: this rank's memory is freed (and its host's and run's directories once empty)."""
        forget_holder(self.holder.dir)
        for parent in (self.holder.dir.parent, self.holder.dir.parent.parent):
            try:
                parent.rmdir()
            except OSError:  # not empty (another rank's memory), or gone
                break

    def forget(self) -> None:
        """A restore from disk or a fresh start begins a new timeline: this rank's copies are another's."""
        self.holder.forget_except(None)
