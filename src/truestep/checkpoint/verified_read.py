"""Read the storage items a rank loads and hand each one on only once its bytes hash to its writer's
digest: a verified load streams, at about the speed of a plain one.

Per file, in file order, three stages overlap: a reader thread reads the next items (each once, a few
items ahead, into reused buffers: memory is bounded by those, not by this rank's share), a hashing thread
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
import io
import os
import queue
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


def _read_into(fd: int, buffer: memoryview, offset: int) -> int:
    """Fill `buffer` from `offset` (less only at the end of the file); no shared file position."""
    done = 0
    while done < buffer.nbytes:
        got = os.preadv(fd, [buffer[done:]], offset + done)
        if not got:
            break
        done += got
    return done


class BufferReader(io.RawIOBase):
    """A read-only file over bytes in memory without copying them (io.BytesIO copies a bytearray), for
    torch.load and DCP's byte items."""

    def __init__(self, data: memoryview) -> None:
        super().__init__()
        self._data = data
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._data.nbytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, into: Any) -> int:
        taken = self._data[self._pos : self._pos + memoryview(into).nbytes]
        memoryview(into).cast("B")[: taken.nbytes] = taken
        self._pos += taken.nbytes
        return taken.nbytes


def _sha256(data: memoryview) -> str:
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
    consume: Callable[[Any, memoryview], None],
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

    # AHEAD reads in flight and one item being consumed each hold a buffer; a buffer is reused (no fresh
    # pages to fault in and zero per item) once the item in it was consumed.
    free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
    for _ in range(AHEAD + 1):
        free.put(bytearray())

    def read_and_hash(offset: int, length: int) -> tuple[bytearray, memoryview, Future[str] | None]:
        buffer = free.get()
        if len(buffer) < length:
            buffer = bytearray(length)
        data = memoryview(buffer)[:length]
        data = data[: _read_into(fd, data, offset)]
        return buffer, data, hasher.submit(_sha256, data) if expected is not None else None

    ahead: deque[Future[tuple[bytearray, memoryview, Future[str] | None]]] = deque()
    try:
        for _, offset, length in ordered[:AHEAD]:
            ahead.append(reader.submit(read_and_hash, offset, length))
        for position, (index, offset, length) in enumerate(ordered):
            buffer, data, digest = ahead.popleft().result()
            if position + AHEAD < len(ordered):
                _, next_offset, next_length = ordered[position + AHEAD]
                ahead.append(reader.submit(read_and_hash, next_offset, next_length))
            if expected is not None:
                if data.nbytes != length:
                    raise _mismatch(name, offset, length, f"{index.fqn}: short read")
                assert digest is not None
                count("while_reading", data.nbytes)
                if digest.result() != expected[(offset, length)]:
                    raise _mismatch(name, offset, length, index.fqn)
            consume(index, data)  # only now: its bytes are the ones its writer hashed
            data.release()
            free.put(buffer)
    finally:
        for pending in ahead:  # a failure mid-file: no read may still use the descriptor once closed
            if not pending.cancel():
                pending.exception()  # waits for it (its own failure, if any, is not this one's cause)
        os.close(fd)


def stream_verified(
    ckpt_dir: Path,
    per_file: dict[str, list[tuple[Any, int, int]]],
    consume: Callable[[Any, memoryview], None],
) -> None:
    """Hand `consume(storage index, its bytes)` (a view valid during the call) every item this rank loads, each once its SHA-256 matched its
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
