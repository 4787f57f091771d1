"""Process groups, the 2-D (dp, tp) mesh, the TP + FSDP2 plan, sharding-aware grad norm, teardown."""

from truestep.parallel.dist import DistContext, broadcast_int, init_distributed, shutdown
from truestep.parallel.grad_norm import clip_grad_norm, global_grad_norm
from truestep.parallel.parallelize import parallelize

__all__ = [
    "DistContext",
    "broadcast_int",
    "clip_grad_norm",
    "global_grad_norm",
    "init_distributed",
    "parallelize",
    "shutdown",
]
