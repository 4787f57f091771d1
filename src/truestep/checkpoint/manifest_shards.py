"""Manifest version 3: each rank commits its own manifest shard; rank 0 writes a manifest of O(ranks).

Every rank, once its items are written (`shard_writer.ShardWriter.write_data`), writes
`manifest.rankNNNNN.json` (`write_shard`): the SHA-256 of every storage item of its `.distcp` files,
hashed while writing. It hashes its own rank-state file too (a few KB), and hands rank 0 a record of a
few hundred bytes through DCP's gathered write results: its shard's name, size and SHA-256, its files'
sizes, its rank-state file's SHA-256. Rank 0 (`write_manifest_v3`) lists the directory, checks it holds
exactly those files with those sizes, hashes only the file it wrote itself (`.metadata`) and what no
rank reported, and writes `manifest.json`:

    {"format": "truestep-manifest", "version": 3, "step": S, "files": {
        ".metadata":               {"size": n, "sha256": d},
        "__0_0.distcp":            {"size": n, "shard": "manifest.rank00000.json"},
        "rank00000.json":          {"size": n, "sha256": d},
        "manifest.rank00000.json": {"size": n, "sha256": d, "rank": 0}, ...}}

one entry per file, none per item: rank 0's work and the manifest it writes grow with the ranks, not
with the storage items (DCP's own `.metadata` still has one entry per item: DCP's, not ours). The
marker binds `manifest.json` by its SHA-256 (`manifest.write_marker`), `manifest.json` binds each shard
by its SHA-256, and a shard binds its items: a shard missing, swapped between ranks or steps, or edited
fails the chain. Reading: `manifest.read_shard`, `manifest.item_digests`, `manifest.verify_files`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from truestep.checkpoint.catalog import MANIFEST, manifest_shard_name
from truestep.checkpoint.hash_counters import count
from truestep.checkpoint.manifest import SHARD_FORMAT, VerifyError, payload_files
from truestep.core.fsio import atomic_write, fsync_dir, sha256_file

ShardRecord = dict[str, Any]
"""What a rank hands rank 0 about its shard: rank, shard, size, sha256, files {name: size}, whole
{name: {size, sha256}} (its files hashed whole: the rank-state file)."""


def write_shard(
    ckpt_dir: Path, step: int, rank: int, items: dict[str, list[list[Any]]], own_files: Iterable[str]
) -> ShardRecord:
    """Write this rank's manifest shard from the item digests of the files it wrote ([offset, length,
    sha256], tiling each file) and return its record for rank 0. `own_files`: small files this rank
    wrote that no item covers (its rank-state file), hashed whole here if present."""
    whole: dict[str, dict[str, Any]] = {}
    for name in own_files:
        path = ckpt_dir / name
        if os.path.lexists(path):
            size = os.lstat(path).st_size
            whole[name] = {"size": size, "sha256": sha256_file(path)}
            count("read_back", size)
    files = {
        name: {"size": max(o + n for o, n, _ in its), "items": sorted(its)} for name, its in items.items()
    }
    shard = {"format": SHARD_FORMAT, "version": 1, "step": step, "rank": rank, "files": files}
    blob = json.dumps(shard, separators=(",", ":"), sort_keys=True).encode()
    name = manifest_shard_name(rank)
    atomic_write(ckpt_dir / name, blob)
    count("shard_entries", sum(len(its) for its in items.values()))
    return {
        "rank": rank,
        "shard": name,
        "size": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
        "files": {name: entry["size"] for name, entry in files.items()},
        "whole": whole,
    }


def _entries(records: Iterable[ShardRecord]) -> dict[str, dict[str, Any]]:
    """The manifest entries the ranks' records describe; VerifyError if two claim one file."""
    files: dict[str, dict[str, Any]] = {}

    def put(name: str, entry: dict[str, Any]) -> None:
        if name in files:
            raise VerifyError(f"{name} is claimed by two ranks' manifest shards")
        files[name] = entry

    for record in records:
        shard = record["shard"]
        if shard != manifest_shard_name(record["rank"]):
            raise VerifyError(f"rank {record['rank']} reported manifest shard {shard!r}")
        put(shard, {"size": record["size"], "sha256": record["sha256"], "rank": record["rank"]})
        for name, size in record["files"].items():
            put(name, {"size": size, "shard": shard})
        for name, entry in record["whole"].items():
            put(name, {"size": entry["size"], "sha256": entry["sha256"]})
    return files


def write_manifest_v3(ckpt_dir: Path, step: int, records: Iterable[ShardRecord]) -> bytes:
    """Rank 0's commit (module docstring): O(files) entries, no shard byte and no manifest shard read.
    VerifyError if the directory does not hold exactly what the ranks reported, with those sizes."""
    files = _entries(records)
    present: set[str] = set()
    for path in payload_files(ckpt_dir):
        name = path.relative_to(ckpt_dir).as_posix()
        present.add(name)
        size = os.lstat(path).st_size
        if name not in files:  # .metadata (rank 0 wrote it), or a file of a rank that wrote no item
            files[name] = {"size": size, "sha256": sha256_file(path)}
            count("read_back", size)
        elif files[name]["size"] != size:
            raise VerifyError(f"{name} is {size} bytes, its rank wrote {files[name]['size']}")
    gone = sorted(set(files) - present)
    if gone:
        raise VerifyError(f"files a rank wrote are gone: {', '.join(gone[:5])}")
    fsync_dir(ckpt_dir)
    manifest = {"format": "truestep-manifest", "version": 3, "step": step, "files": files}
    blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
    atomic_write(ckpt_dir / MANIFEST, blob)
    count("manifest_entries", len(files))
    return blob
