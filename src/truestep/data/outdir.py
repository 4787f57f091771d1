"""The output side of `prepare-data`: claiming the data directory, and the shard writer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from truestep.data.atomic import atomic_save_npy, is_temp_name
from truestep.data.errors import DataUsageError
from truestep.data.meta import FORMAT, JOURNAL_NAME, META_NAME, SHARD_RE, shard_name
from truestep.data.tokenizer_files import TOKENIZER_FILES


def _is_ours(name: str) -> bool:
    """Names prepare_data itself writes (including temp files a killed run left behind)."""
    return (
        name in (META_NAME, JOURNAL_NAME)
        or name in TOKENIZER_FILES
        or bool(SHARD_RE.fullmatch(name))
        or is_temp_name(name)
    )


def _is_data(name: str) -> bool:
    """Names only prepare_data writes: a directory holding nothing but tokenizer files is somebody's."""
    return _is_ours(name) and name not in TOKENIZER_FILES


def _has_truestep_meta(out_dir: Path) -> bool:
    try:
        meta = json.loads((out_dir / META_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def is_replaceable_dir(path: Path) -> bool:
    """True if `path` is empty or a previous truestep data dir, i.e. safe to overwrite.

    A directory whose every entry is ours is an interrupted earlier run and is safe to redo.
    """
    names = [p.name for p in path.iterdir()]
    return (
        not names
        or _has_truestep_meta(path)
        or (all(_is_ours(n) for n in names) and any(_is_data(n) for n in names))
    )


def claim_out_dir(out_dir: Path, keep: set[str] | frozenset[str] = frozenset()) -> None:
    """Create `out_dir`, or clear a previous truestep data dir in it (but the names in `keep`: the shards
    and journal of a run being resumed); refuse anything else."""
    if out_dir.exists() and not out_dir.is_dir():
        raise DataUsageError(f"output path {out_dir} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [p.name for p in out_dir.iterdir()]
    if not names:
        return
    if not is_replaceable_dir(out_dir):
        raise DataUsageError(
            f"refusing to write into {out_dir}: it is not empty and is not a truestep data directory "
            f"(no {META_NAME} with format {FORMAT!r}); choose an empty or new directory"
        )
    # meta.json goes first: until the new one is written, the directory must not look complete.
    (out_dir / META_NAME).unlink(missing_ok=True)
    for name in names:
        if _is_ours(name) and name not in keep:
            (out_dir / name).unlink(missing_ok=True)


class ShardWriter:
    """Accumulates token arrays and writes a shard every `shard_tokens` tokens (memory: one shard)."""

    def __init__(
        self, out_dir: Path, dtype: np.dtype, shard_tokens: int, shards: list[dict[str, Any]] | None = None
    ) -> None:
        """`shards`: those already written by the run being resumed."""
        self.out_dir = out_dir
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.pending: list[np.ndarray] = []
        self.pending_len = 0
        self.shards: list[dict[str, Any]] = list(shards or [])
        self.num_tokens = sum(int(entry["num_tokens"]) for entry in self.shards)

    def add(self, tokens: np.ndarray, on_shard: Callable[[int], None] | None = None) -> None:
        """Append `tokens`; after each shard written, `on_shard(tokens of this array now in shards)`."""
        tokens = tokens.astype(self.dtype, copy=False)
        used = 0
        while used < tokens.size:
            take = min(self.shard_tokens - self.pending_len, tokens.size - used)
            self.pending.append(tokens[used : used + take])
            self.pending_len += take
            used += take
            if self.pending_len == self.shard_tokens:
                self.flush()
                if on_shard is not None:
                    on_shard(used)

    def flush(self) -> None:
        if not self.pending_len:
            return
        arr = np.concatenate(self.pending)
        name = shard_name(len(self.shards))
        digest = atomic_save_npy(self.out_dir / name, arr)
        self.shards.append({"file": name, "num_tokens": int(arr.size), "sha256": digest})
        self.num_tokens += int(arr.size)
        self.pending, self.pending_len = [], 0

    def remove_written(self) -> None:
        for entry in self.shards:
            (self.out_dir / str(entry["file"])).unlink(missing_ok=True)
