"""Collective timeouts: generous for start-up, restore and the first step; short afterwards, so a rank
waiting on a dead or hung peer raises in seconds rather than after the 10-30 minute default."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from torch.distributed.distributed_c10d import _set_pg_timeout

from truestep.parallel.dist import DistContext


def set_collective_timeout(ctx: DistContext, seconds: float) -> None:
    """Apply to the default group and every mesh group (private torch API, checked by a test)."""
    if not ctx.distributed:
        return
    assert ctx.mesh is not None
    timeout = timedelta(seconds=seconds)
    groups = {id(g): g for g in [dist.group.WORLD, *(ctx.mesh[d].get_group() for d in ("dp", "tp"))]}
    for group in groups.values():
        _set_pg_timeout(timeout, group)
