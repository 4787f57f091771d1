"""Who this process is in a torchrun-style job: RANK, WORLD_SIZE and LOCAL_RANK from the environment,
defaulting to a single process. Standard library only (read before torch is imported)."""

from __future__ import annotations

import os


def world_from_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, world, local
