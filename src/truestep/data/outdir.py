"""The output side of `prepare-data`: claiming the data directory, and the shard writer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from truestep.data.atomic import atomic_save_npy, is_temp_name
from truestep.data.errors import DataUsageError
from truestep.data.meta import FORMAT, JOURNAL_NAME, MASK_RE, META_NAME, SHARD_RE, mask_name, shard_name
from truestep.data.tokenizer_files import TOKENIZER_FILES


def _is_ours(name: str) -> bool:
    """Names prepare_data itself writes (including temp files a killed run left behind)."""
    return (
        name in (META_NAME, JOURNAL_NAME)
        or name in TOKENIZER_FILES
        or bool(SHARD_RE.fullmatch(name))
        or bool(MASK_RE.fullmatch(name))
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
    """Accumulates token arrays and writes a shard every `shard_tokens` tokens (memory: one shard); with
    `masked`, each shard's loss mask beside it (`mask_NNNNN.npy`)."""

    def __init__(
        self,
        out_dir: Path,
        dtype: np.dtype,
        shard_tokens: int,
        shards: list[dict[str, Any]] | None = None,
        masked: bool = False,
    ) -> None:
        """`shards`: those already written by the run being resumed."""
        self.out_dir = out_dir
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.masked = masked
        self.pending: list[np.ndarray] = []
        self.pending_masks: list[np.ndarray] = []
        self.pending_len = 0
        self.shards: list[dict[str, Any]] = list(shards or [])
        self.num_tokens = sum(int(entry["num_tokens"]) for entry in self.shards)

    def add(
        self,
        tokens: np.ndarray,
        on_shard: Callable[[int], None] | None = None,
        mask: np.ndarray | None = None,
    ) -> None:
        """Append `tokens` (and their `mask`, when masked); after each shard written, `on_shard(tokens of
        this array now in shards)`."""
        assert (mask is not None) == self.masked and (mask is None or mask.size == tokens.size)
        tokens = tokens.astype(self.dtype, copy=False)
        used = 0
        while used < tokens.size:
            take = min(self.shard_tokens - self.pending_len, tokens.size - used)
            self.pending.append(tokens[used : used + take])
            if mask is not None:
                self.pending_masks.append(mask[used : used + take])
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
        index = len(self.shards)
        entry: dict[str, Any] = {"file": shard_name(index), "num_tokens": int(arr.size)}
        if self.masked:  # the mask first: a shard on disk always has its mask
            mask = np.concatenate(self.pending_masks).astype(np.uint8, copy=False)
            entry["mask"] = mask_name(index)
            entry["mask_sha256"] = atomic_save_npy(self.out_dir / entry["mask"], mask)
        entry["sha256"] = atomic_save_npy(self.out_dir / entry["file"], arr)
        self.shards.append(entry)
        self.num_tokens += int(arr.size)
        self.pending, self.pending_masks, self.pending_len = [], [], 0

    def remove_written(self) -> None:
        for entry in self.shards:
            for key in ("file", "mask"):
                if key in entry:
                    (self.out_dir / str(entry[key])).unlink(missing_ok=True)
