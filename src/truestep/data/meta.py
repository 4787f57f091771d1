"""The on-disk format of a prepared data directory: `meta.json` plus `.npy` token shards.

meta.json is written last, so its presence marks a complete directory; everything a reader needs
(dtype, token counts, EOS id, shard hashes) is recorded there and cross-checked against the shards.
Chat data (`chat` in meta.json) has a loss mask beside every token shard: `mask_NNNNN.npy`, uint8, one
value per token (1: trained), listed with its digest in the shard's entry.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from truestep.data.errors import DataError

FORMAT = "truestep-tokens"
VERSION = 1
META_NAME = "meta.json"
JOURNAL_NAME = "prepare-journal.json"
"""Present only while prepare-data runs or after it was interrupted (data/journal.py)."""
SHARD_RE = re.compile(r"shard_\d{5}\.npy")
MASK_RE = re.compile(r"mask_\d{5}\.npy")
MASK_DTYPE = "uint8"
PACKINGS = ("pack", "pad")
ALLOWED_DTYPES = ("uint16", "uint32")


def shard_name(index: int) -> str:
    """File name of shard `index` (zero-padded so a plain sort matches stream order)."""
    return f"shard_{index:05d}.npy"


def mask_name(index: int) -> str:
    """File name of the loss mask of shard `index` (chat data)."""
    return f"mask_{index:05d}.npy"


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """Smallest supported unsigned dtype that holds every id of a `vocab_size` vocabulary."""
    if vocab_size <= 0:
        raise DataError(f"vocab_size must be positive, got {vocab_size}")
    if vocab_size <= 65535:
        return np.dtype(np.uint16)
    if vocab_size <= 2**32 - 1:
        return np.dtype(np.uint32)
    raise DataError(f"vocab_size {vocab_size} does not fit in uint32 token ids")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes (the whole .npy file, header included)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def content_digest(meta: dict[str, Any]) -> str:
    """SHA-256 of what a prepared directory's tokens are, from its meta.json: the dtype, vocabulary and
    special ids, and every shard's name, length and the sha256 prepare-data recorded for it (chat data:
    its masks' sha256 and its `chat` record too). Re-prepared
    text gives another digest; the path does not count. Cheap: no shard is read (the shards are checked
    against these hashes by `verify_data_dir`)."""
    keys = ("dtype", "vocab_size", "eos_id", "bos_id", "tokenizer", "num_tokens")
    content = {k: meta.get(k) for k in keys}
    content["shards"] = [[e.get("file"), e.get("num_tokens"), e.get("sha256")] for e in meta["shards"]]
    if "chat" in meta:  # the loss masks shape the trajectory as much as the tokens (pretraining: unchanged)
        content["masks"] = [e.get("mask_sha256") for e in meta["shards"]]
        content["chat"] = meta["chat"]
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def _require_int(meta: dict[str, Any], key: str, where: str, minimum: int = 0) -> int:
    value = meta.get(key)
    # bool is an int subclass; a `true` in JSON is never a valid count.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise DataError(f"{where}: field {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def read_meta(data_dir: Path) -> dict[str, Any]:
    """Load and structurally validate `data_dir/meta.json` (shards are not opened here)."""
    path = Path(data_dir) / META_NAME
    if not path.is_file():
        raise DataError(
            f"{data_dir} is not a prepared data directory: {META_NAME} is missing "
            "(create one with `truestep prepare-data`)"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, huge ints
        raise DataError(f"cannot read {path}: {type(e).__name__}: {str(e)[:200]}") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise DataError(f"{path}: format is {got!r}, expected {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise DataError(
            f"{path}: unsupported version {meta.get('version')!r} (this truestep reads {VERSION})"
        )
    if meta.get("dtype") not in ALLOWED_DTYPES:
        raise DataError(f"{path}: dtype {meta.get('dtype')!r} is not one of {ALLOWED_DTYPES}")
    vocab_size = _require_int(meta, "vocab_size", str(path), minimum=1)
    eos_id = _require_int(meta, "eos_id", str(path))
    if eos_id >= vocab_size:
        raise DataError(f"{path}: eos_id {eos_id} is outside vocab_size {vocab_size}")
    if np.dtype(meta["dtype"]) != dtype_for_vocab(vocab_size):
        raise DataError(f"{path}: dtype {meta['dtype']} does not match vocab_size {vocab_size}")
    num_tokens = _require_int(meta, "num_tokens", str(path))
    shards = meta.get("shards")
    if not isinstance(shards, list) or not shards:
        raise DataError(f"{path}: 'shards' must be a non-empty list")
    total = 0
    for i, entry in enumerate(shards):
        where = f"{path}: shards[{i}]"
        if not isinstance(entry, dict):
            raise DataError(f"{where} must be an object")
        name = entry.get("file")
        # Only bare shard names: a crafted meta.json must not point the reader outside the directory.
        if not isinstance(name, str) or not SHARD_RE.fullmatch(name):
            raise DataError(f"{where}: file {name!r} is not a shard_NNNNN.npy name")
        total += _require_int(entry, "num_tokens", where, minimum=1)
        if not isinstance(entry.get("sha256"), str):
            raise DataError(f"{where}: missing sha256")
    if total != num_tokens:
        raise DataError(f"{path}: shards hold {total} tokens but num_tokens says {num_tokens}")
    if "chat" in meta:
        _check_chat(meta, path)
    return meta


def _check_chat(meta: dict[str, Any], path: Path) -> None:
    """A chat directory's record: its window length and packing, and a mask named for every shard."""
    chat = meta["chat"]
    if not isinstance(chat, dict) or chat.get("packing") not in PACKINGS:
        raise DataError(f"{path}: 'chat' must be an object with a packing of {PACKINGS}")
    _require_int(chat, "seq_len", f"{path}: chat", minimum=1)
    for i, entry in enumerate(meta["shards"]):
        if entry.get("mask") != mask_name(i) or not isinstance(entry.get("mask_sha256"), str):
            raise DataError(
                f"{path}: shards[{i}] of chat data must name its mask {mask_name(i)} and its sha256"
            )


def open_shard(data_dir: Path, entry: dict[str, Any], dtype: str) -> np.ndarray:
    """Memory-map one shard and check it against its meta entry (dtype, rank, length)."""
    path = Path(data_dir) / entry["file"]
    if not path.is_file():
        raise DataError(f"shard {path} listed in {META_NAME} is missing")
    try:
        # allow_pickle=False: a data directory may come from anywhere and must never run code.
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read shard {path}: {e}") from e
    if arr.dtype != np.dtype(dtype):
        raise DataError(f"shard {path} has dtype {arr.dtype}, but {META_NAME} says {dtype}")
    if arr.ndim != 1:
        raise DataError(f"shard {path} has shape {arr.shape}, expected a 1-D token array")
    if arr.shape[0] != entry["num_tokens"]:
        raise DataError(
            f"shard {path} holds {arr.shape[0]} tokens, but {META_NAME} says {entry['num_tokens']}"
        )
    return arr


def open_mask(data_dir: Path, entry: dict[str, Any]) -> np.ndarray:
    """Memory-map the loss mask of one shard (chat data) and check it against the shard's entry."""
    mask = {"file": entry["mask"], "num_tokens": entry["num_tokens"]}
    return open_shard(data_dir, mask, MASK_DTYPE)


def verify_data_dir(data_dir: Path, check_hashes: bool = True) -> dict[str, Any]:
    """Validate meta.json and every shard and mask (and, optionally, their sha256); return the meta."""
    meta = read_meta(data_dir)
    for entry in meta["shards"]:
        open_shard(data_dir, entry, meta["dtype"])
        files = [(entry["file"], entry["sha256"])]
        if "chat" in meta:
            open_mask(data_dir, entry)
            files.append((entry["mask"], entry["mask_sha256"]))
        for name, expected in files if check_hashes else []:
            if sha256_file(Path(data_dir) / name) != expected:
                raise DataError(f"shard {Path(data_dir) / name} fails its sha256 check")
    return meta
