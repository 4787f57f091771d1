"""What shapes a run's trajectory beyond its config, recorded in every attempt's `run_start`.

The config fingerprint names the keys that shape the trajectory; it cannot see the code that ran, the
tokens a `data.path` held that day, the weights `checkpoint.init_from` pointed at, or the torch that
computed it. The instrument compares reference, floor and run under test on these too
(analysis/provenance.py), so a floor re-run after the corpus was re-prepared, or by another version of
the code, is refused instead of silently widening the envelope.

- `truestep_version` and `source_sha256`: the package version and a digest of the installed truestep
  source (every file of the package, by relative path and content; computed once per process);
- `torch_version`;
- `data_sha256`: of the token shards the loader reads (data/meta.py `content_digest`, from the per-shard
  sha256 prepare-data recorded; every source of a mixture, in order);
- `init_from_sha256`: of the manifest (which holds every file's sha256) of the checkpoint
  `checkpoint.init_from` resolves to, by an attempt that started from it; "" when there is none, and
  "not read (resumed)" for an attempt that restored a checkpoint instead.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import torch

import truestep
from truestep.checkpoint.catalog import MANIFEST
from truestep.checkpoint.resolver import CheckpointNotFound, find_verified
from truestep.data.meta import content_digest

RESUMED = "not read (resumed)"


@functools.cache
def source_digest() -> str:
    """SHA-256 over every file of the installed truestep package (relative path and bytes), bytecode
    caches left out."""
    root = Path(truestep.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        if path.suffix in (".pyc", ".pyo"):
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def data_digest(loader: Any) -> str:
    """The content digest of what `loader` reads: one directory, or every source of a mixture."""
    sources = getattr(loader, "sources", None)
    datasets = [s.dataset for s in sources] if sources is not None else [loader.dataset]
    digests = [content_digest(d.meta) for d in datasets]
    return digests[0] if len(digests) == 1 else hashlib.sha256("".join(digests).encode()).hexdigest()


def init_digest(init_from: str) -> str:
    """The digest of the manifest of the checkpoint `init_from` resolves to (sizes verified, as the
    trainer's pre-check does); an unreadable source says why instead of a digest."""
    try:
        step_dir = find_verified(Path(init_from).expanduser(), checksums=False)
        return hashlib.sha256((step_dir / MANIFEST).read_bytes()).hexdigest()
    except (CheckpointNotFound, OSError) as err:
        return f"unreadable: {err}"


def provenance(loader: Any, init_from: str, fresh_start: bool) -> dict[str, str]:
    """The run_start `provenance` record of one attempt (module docstring)."""
    return {
        "truestep_version": truestep.__version__,
        "source_sha256": source_digest(),
        "torch_version": torch.__version__,
        "data_sha256": data_digest(loader),
        "init_from_sha256": (init_digest(init_from) if fresh_start else RESUMED) if init_from else "",
    }
