"""Small generated corpora in every format prepare-data reads, holding the same documents."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

EOS = 256

DOCS = [
    "The first document.",
    "héllo wörld ✓ — unicode, and a line\nbreak inside",
    "",  # an empty document still ends with EOS
    '{"looks": "like json"} but is text',
    "tab\tand carriage\r\nreturn",
    *(f"document {i}: " + "lorem ipsum dolor " * (i % 13) for i in range(120)),
]


def expected_stream(docs: list[str], bos: int | None = None) -> list[int]:
    out: list[int] = []
    for doc in docs:
        out += ([bos] if bos is not None else []) + list(doc.encode("utf-8")) + [EOS]
    return out


def jsonl_bytes(docs: list[str], field: str = "text") -> bytes:
    return b"".join(json.dumps({"id": i, field: d}).encode() + b"\n" for i, d in enumerate(docs))


def write_txt(directory: Path, docs: list[str]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, doc in enumerate(docs):
        path = directory / f"doc{i:04d}.txt"
        path.write_bytes(doc.encode("utf-8"))
        paths.append(path)
    return paths


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_bytes(jsonl_bytes(docs, field))
    return path


def write_gz(path: Path, docs: list[str]) -> Path:
    path.write_bytes(gzip.compress(jsonl_bytes(docs)))
    return path


def write_zst(path: Path, docs: list[str]) -> Path:
    """Two zstd frames back to back, as `cat a.zst b.zst` makes."""
    import zstandard

    half = len(docs) // 2
    compress = zstandard.ZstdCompressor().compress
    path.write_bytes(compress(jsonl_bytes(docs[:half])) + compress(jsonl_bytes(docs[half:])))
    return path


def write_parquet(path: Path, docs: list[str], field: str = "text", row_group_size: int = 16) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(len(docs))), field: docs, "url": ["u"] * len(docs)})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_hf_dataset(path: Path, docs: list[str], field: str = "text") -> Path:
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({field: docs, "id": list(range(len(docs)))}).save_to_disk(
        str(path), max_shard_size=2000
    )
    return path


def stream(data_dir: Path) -> np.ndarray:
    """The whole token stream of a data directory, read without truestep."""
    meta = json.loads((data_dir / "meta.json").read_text())
    parts = [np.load(data_dir / s["file"], allow_pickle=False) for s in meta["shards"]]
    return np.concatenate(parts).astype(np.int64)
