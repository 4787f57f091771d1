"""`prepare_data`: tokenize text files into `.npy` shards plus a self-describing `meta.json`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from truestep.data.atomic import atomic_save_npy, atomic_write_bytes, is_temp_name
from truestep.data.errors import DataError
from truestep.data.meta import FORMAT, META_NAME, SHARD_RE, VERSION, dtype_for_vocab, shard_name
from truestep.data.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from truestep.data.tokenizer_files import (
    TOKENIZER_FILES,
    TOKENIZER_JSON,
    read_tokenizer_files,
    write_tokenizer_files,
)

DEFAULT_SHARD_TOKENS = 16_777_216  # 32 MiB per shard at uint16: few files, cheap to hash and mmap


def _is_ours(name: str) -> bool:
    """Names prepare_data itself writes (including temp files a killed run left behind)."""
    return (
        name == META_NAME or name in TOKENIZER_FILES or bool(SHARD_RE.fullmatch(name)) or is_temp_name(name)
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


def _claim_out_dir(out_dir: Path) -> None:
    """Create `out_dir`, or clear a previous truestep data dir in it; refuse anything else."""
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"output path {out_dir} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [p.name for p in out_dir.iterdir()]
    if not names:
        return
    if not is_replaceable_dir(out_dir):
        raise DataError(
            f"refusing to write into {out_dir}: it is not empty and is not a truestep data directory "
            f"(no {META_NAME} with format {FORMAT!r}); choose an empty or new directory"
        )
    # meta.json goes first: until the new one is written, the directory must not look complete.
    (out_dir / META_NAME).unlink(missing_ok=True)
    for name in names:
        if _is_ours(name):
            (out_dir / name).unlink(missing_ok=True)


def _check_inputs(text_files: list[Path]) -> list[Path]:
    """Fail before touching the output if any input is missing, so a typo costs nothing."""
    if not text_files:
        raise DataError("no input text files given")
    paths = [Path(p) for p in text_files]
    for p in paths:
        if not p.is_file():
            raise DataError(f"input file not found (or not a regular file): {p}")
        if not os.access(p, os.R_OK):
            raise DataError(f"input file is not readable: {p}")
    return paths


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read input file {path}: {e}") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"input file {path} is not valid UTF-8: {e}") from e


class _ShardWriter:
    """Accumulates token arrays and writes a shard every `shard_tokens` tokens."""

    def __init__(self, out_dir: Path, dtype: np.dtype, shard_tokens: int) -> None:
        self.out_dir = out_dir
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.pending: list[np.ndarray] = []
        self.pending_len = 0
        self.shards: list[dict[str, object]] = []
        self.num_tokens = 0

    def add(self, tokens: np.ndarray) -> None:
        tokens = tokens.astype(self.dtype, copy=False)
        while tokens.size:
            take = min(self.shard_tokens - self.pending_len, tokens.size)
            self.pending.append(tokens[:take])
            self.pending_len += take
            tokens = tokens[take:]
            if self.pending_len == self.shard_tokens:
                self.flush()

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


def encode_document(tok: Tokenizer, text: str) -> np.ndarray:
    """Token ids of one document followed by EOS, range-checked against the vocabulary."""
    ids = tok.encode_array(text)
    if ids.size and (int(ids.max()) >= tok.vocab_size or int(ids.min()) < 0):
        raise DataError(f"tokenizer {tok.name} produced an id outside its vocab_size {tok.vocab_size}")
    out = np.empty(ids.size + 1, dtype=np.int64)
    out[:-1] = ids
    out[-1] = tok.eos_id
    return out


def prepare_data(
    text_files: list[Path],
    out_dir: Path,
    tokenizer_spec: str = "byte",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    eos_token: str | None = None,
) -> Path:
    """Tokenize `text_files` (one document each, EOS after each) into shards under `out_dir`.

    Returns `out_dir`. The stream order is the order of `text_files`; callers wanting a stable
    corpus should pass a sorted list.
    """
    if shard_tokens <= 0:
        raise DataError(f"shard_tokens must be positive, got {shard_tokens}")
    paths = _check_inputs(text_files)
    tok = load_tokenizer(tokenizer_spec, eos_token=eos_token)
    is_byte = isinstance(tok, ByteTokenizer)
    # Read now: claiming out_dir below clears a previous copy, which may be the tokenizer given here.
    tokenizer_bytes = {} if is_byte else read_tokenizer_files(Path(tokenizer_spec))
    dtype = dtype_for_vocab(tok.vocab_size)
    out_dir = Path(out_dir)
    _claim_out_dir(out_dir)
    writer = _ShardWriter(out_dir, dtype, shard_tokens)
    tokenizer_files: list[str] = []
    try:
        for path in paths:
            writer.add(encode_document(tok, _read_text(path)))
        writer.flush()
        # The tokenizer is copied in and named relative to out_dir, so it travels with the data.
        tokenizer_files = write_tokenizer_files(tokenizer_bytes, out_dir)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": "byte" if is_byte else TOKENIZER_JSON,
            **({"tokenizer_files": tokenizer_files} if tokenizer_files else {}),
            "vocab_size": int(tok.vocab_size),
            "eos_id": int(tok.eos_id),
            "bos_id": tok.bos_id,
            "pad_id": tok.pad_id,
            "dtype": dtype.name,
            "num_tokens": writer.num_tokens,
            "shards": writer.shards,
            "documents": len(paths),
        }
        # Written last: its presence is what marks the directory complete.
        atomic_write_bytes(out_dir / META_NAME, (json.dumps(meta, indent=2) + "\n").encode("utf-8"))
    except BaseException:
        writer.remove_written()
        for name in tokenizer_files:
            (out_dir / name).unlink(missing_ok=True)
        raise
    return out_dir
