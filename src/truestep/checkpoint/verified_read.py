"""Read the storage items a rank loads and hand each one on only once its bytes hash to its writer's
digest: a verified load streams, at about the speed of a plain one.

Per file, in file order, three stages overlap: a reader thread reads the next items (each once, a few
items ahead: memory is bounded by those, not by this rank's share of the checkpoint), a hashing thread
hashes each item as soon as it is read (hashlib releases the GIL), and the calling thread waits for an
item's digest, compares it, and only then deserializes the item into its target (`consume`). So no byte
that failed its hash is ever deserialized or copied anywhere.

What is not held back any more: the good items of a checkpoint whose other items turn out bad -- on this
rank, after them, or on another rank -- are already in their targets when the load fails. The ranks
agree once, at the end: DCP gathers every rank's failure to every rank after `read_data`, and all of
them raise (`safe_dcp.load_dcp`). The caller must then not use the targets: a resume quarantines the
checkpoint and either loads an older one, which overwrites every target, or starts fresh, which
re-initializes everything (`Trainer.initialize`: weights, optimizer state, counters, data position,
RNG); a Trainer refuses to step on weights neither initialized nor loaded whole.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch.distributed as dist

from truestep.checkpoint.errors import CheckpointContentError
from truestep.checkpoint.hash_counters import count
from truestep.checkpoint.manifest import VerifyError, item_digests
from truestep.core.fsio import UnsafePathError, open_regular, plain_file_name

AHEAD = 2
"""Items read ahead of the one being deserialized (each is also being hashed meanwhile)."""


class DigestMismatchError(CheckpointContentError):
    """An item's bytes are not the bytes its writer hashed (a flipped bit, a swapped shard)."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _read(fd: int, offset: int, length: int) -> bytes:
    """`length` bytes at `offset` (fewer only at the end of the file); no shared file position."""
    parts: list[bytes] = []
    while length:
        part = os.pread(fd, length, offset)
        if not part:
            break
        parts.append(part)
        offset, length = offset + len(part), length - len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _mismatch(name: str, offset: int, length: int, what: str) -> DigestMismatchError:
    return DigestMismatchError(
        f"{name}: SHA-256 mismatch (corrupted) in bytes {offset}..{offset + length} ({what}), "
        f"found by rank {_rank()}"
    )


def _stream_file(
    ckpt_dir: Path,
    name: str,
    ranges: list[tuple[Any, int, int]],
    expected: dict[tuple[int, int], str] | None,
    consume: Callable[[Any, bytes], None],
    reader: ThreadPoolExecutor,
    hasher: ThreadPoolExecutor,
) -> None:
    if not plain_file_name(name):  # checked with the metadata; never open anything else
        raise CheckpointContentError(f"storage path {name!r} is not a plain file name")
    ordered = sorted(ranges, key=lambda r: r[1])
    if expected is not None:  # None: a v1 file, hashed whole before the load
        for index, offset, length in ordered:
            if (offset, length) not in expected:
                raise CheckpointContentError(
                    f"{name}: bytes {offset}..{offset + length} ({index.fqn}) are not an item its writer hashed"
                )
    try:
        fd = open_regular(ckpt_dir / name)
    except UnsafePathError as err:
        raise CheckpointContentError(f"storage file {name}: {err.strerror}") from None

    def read_and_hash(offset: int, length: int) -> tuple[bytes, Future[str] | None]:
        data = _read(fd, offset, length)
        return data, hasher.submit(_sha256, data) if expected is not None else None

    ahead: deque[Future[tuple[bytes, Future[str] | None]]] = deque()
    try:
        for _, offset, length in ordered[:AHEAD]:
            ahead.append(reader.submit(read_and_hash, offset, length))
        for position, (index, offset, length) in enumerate(ordered):
            data, digest = ahead.popleft().result()
            if position + AHEAD < len(ordered):
                _, next_offset, next_length = ordered[position + AHEAD]
                ahead.append(reader.submit(read_and_hash, next_offset, next_length))
            if expected is not None:
                if len(data) != length:
                    raise _mismatch(name, offset, length, f"{index.fqn}: short read")
                assert digest is not None
                count("while_reading", len(data))
                if digest.result() != expected[(offset, length)]:
                    raise _mismatch(name, offset, length, index.fqn)
            consume(index, data)  # only now: its bytes are the ones its writer hashed
    finally:
        for pending in ahead:  # a failure mid-file: no read may still use the descriptor once closed
            if not pending.cancel():
                pending.exception()  # waits for it (its own failure, if any, is not this one's cause)
        os.close(fd)


def stream_verified(
    ckpt_dir: Path,
    per_file: dict[str, list[tuple[Any, int, int]]],
    consume: Callable[[Any, bytes], None],
) -> None:
    """Hand `consume(storage index, bytes)` every item this rank loads, each once its SHA-256 matched its
    writer's digest (module docstring). `per_file`: file name -> (storage index, offset, length) of each
    item. Raises DigestMismatchError (or another CheckpointContentError) at the first bad item; the items
    consumed before it stay consumed: the caller must not use the targets then."""
    try:
        digests = item_digests(ckpt_dir, set(per_file))
    except (VerifyError, OSError) as err:
        raise CheckpointContentError(f"item digests unusable: {err}") from err
    with (
        ThreadPoolExecutor(1, thread_name_prefix="truestep-read") as reader,
        ThreadPoolExecutor(1, thread_name_prefix="truestep-hash") as hasher,
    ):
        for name, ranges in per_file.items():
            _stream_file(ckpt_dir, name, ranges, digests.get(name), consume, reader, hasher)
