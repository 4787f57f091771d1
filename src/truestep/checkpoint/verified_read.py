"""Read the storage items a rank loads, hash each against its writer's digest, and agree across ranks
before any of their bytes is deserialized or copied into a tensor.

Each item is read once, in file order, into memory and hashed there (no second read pass). Every rank
then takes part in one all-reduce of a failure flag, whatever went wrong locally (so a rank that failed
cannot leave the others waiting in a collective): if any rank found a bad item, every rank raises and
none has copied a byte of this checkpoint into its model or optimizer. A resume that falls back to an
older checkpoint, or to a fresh start, therefore begins from untouched state. The price is memory: the
bytes this rank loads are held in host memory until the agreement (one rank's share of the checkpoint).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import MetadataIndex

from truestep.checkpoint.errors import CheckpointContentError
from truestep.checkpoint.hash_counters import count
from truestep.checkpoint.manifest import VerifyError, item_digests
from truestep.core.fsio import UnsafePathError, open_regular, plain_file_name


class DigestMismatchError(CheckpointContentError):
    """An item's bytes are not the bytes its writer hashed (a flipped bit, a swapped shard)."""


class PeerFoundBadItemsError(CheckpointContentError):
    """Another rank found this checkpoint's bytes bad: this rank loads none of its own either."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()  # releases the GIL: runs beside the next read


def _read_file(ckpt_dir: Path, name: str, ranges: list[tuple[MetadataIndex, int, int]], digests: Any) -> dict:
    """Each item read once, in file order; item i is hashed on a worker thread while item i+1 is read
    (the blobs are immutable bytes, so nothing changes under the hash)."""
    if not plain_file_name(name):  # checked with the metadata; never open anything else
        raise CheckpointContentError(f"storage path {name!r} is not a plain file name")
    expected = digests.get(name)
    blobs: dict[MetadataIndex, bytes] = {}
    hashed: list[tuple[MetadataIndex, int, int, Future[str]]] = []
    try:
        fd = open_regular(ckpt_dir / name)
    except UnsafePathError as err:
        raise CheckpointContentError(f"storage file {name}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as stream, ThreadPoolExecutor(1, thread_name_prefix="truestep-hash") as hasher:
        for index, offset, length in sorted(ranges, key=lambda r: r[1]):
            stream.seek(offset)
            data = stream.read(length)
            if expected is not None:  # no digests: a v1 file, hashed whole before the load
                if expected.get((offset, length)) is None:
                    raise CheckpointContentError(
                        f"{name}: bytes {offset}..{offset + length} ({index.fqn}) are not an item its writer hashed"
                    )
                if len(data) != length:
                    raise DigestMismatchError(
                        f"{name}: SHA-256 mismatch (corrupted) in bytes {offset}..{offset + length} "
                        f"({index.fqn}: short read), found by rank {_rank()}"
                    )
                count("while_reading", len(data))
                hashed.append((index, offset, length, hasher.submit(_sha256, data)))
            blobs[index] = data
    for index, offset, length, digest in hashed:
        if digest.result() != expected[(offset, length)]:
            raise DigestMismatchError(
                f"{name}: SHA-256 mismatch (corrupted) in bytes {offset}..{offset + length} "
                f"({index.fqn}), found by rank {_rank()}"
            )
    return blobs


def _anyone_failed(failed: bool) -> bool:
    flag = torch.tensor([1 if failed else 0], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        flag = flag.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def read_verified(
    ckpt_dir: Path, per_file: dict[str, list[tuple[MetadataIndex, int, int]]], collective: bool
) -> dict[MetadataIndex, bytes]:
    """Storage index -> its bytes, every item hashed and agreed good on every rank (module docstring).
    `per_file`: file name -> (storage index, offset, length) of each item this rank loads."""
    failure: Exception | None = None
    blobs: dict[MetadataIndex, bytes] = {}
    try:
        try:
            digests = item_digests(ckpt_dir)
        except (VerifyError, OSError) as err:
            raise CheckpointContentError(f"item digests unusable: {err}") from err
        for name, ranges in per_file.items():
            blobs.update(_read_file(ckpt_dir, name, ranges, digests))
    except Exception as err:  # raised below, after every rank has had its say
        failure = err
    anyone = (
        _anyone_failed(failure is not None) if collective and dist.is_initialized() else failure is not None
    )
    if failure is not None:
        raise failure
    if anyone:
        raise PeerFoundBadItemsError(
            "another rank found this checkpoint's bytes bad; none of them is loaded here"
        )
    return blobs
