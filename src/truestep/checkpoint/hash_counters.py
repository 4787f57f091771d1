"""How many checkpoint bytes this process hashed, and where: the evidence (not a timing) that integrity
costs O(bytes this rank writes or reads), read by tests and `benchmarks/integrity_scale.py`.

- `while_writing`: bytes hashed in the storage writer's stream as they were written (no read);
- `while_reading`: bytes hashed by the safe reader as it read them for the load (no extra read);
- `read_back`: bytes of a checkpoint file read again only to hash it (commit of files no writer hashed,
  `ckpt verify`, verification of v1 manifests): the extra read passes the design keeps at zero for shards;
- `shard_entries`: item digests this rank wrote into its own manifest shard (manifest v3);
- `manifest_entries`: entries written into a top-level manifest (rank 0's commit): one per file and per
  manifest shard in v3, O(ranks); one per storage item in v2, O(items).
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass


@dataclass
class HashCounters:
    while_writing: int = 0
    while_reading: int = 0
    read_back: int = 0
    shard_entries: int = 0
    manifest_entries: int = 0


_lock = threading.Lock()
_counters = HashCounters()


def count(field: str, nbytes: int) -> None:
    """Add `nbytes` (or entries) to one counter (DCP writes from several threads)."""
    with _lock:
        setattr(_counters, field, getattr(_counters, field) + nbytes)


def snapshot() -> dict[str, int]:
    with _lock:
        return asdict(_counters)


def reset() -> None:
    global _counters
    with _lock:
        _counters = HashCounters()
