"""The storage writer every save uses: DCP's FileSystemWriter that hashes each storage item while it
streams it to disk, never follows a symlink and carries the `save:mid-shards` fault point.

Each item DCP writes (one tensor chunk or one bytes object, a contiguous byte range of a `.distcp` file)
passes through `_HashingItemStream` on its way to the file, so its SHA-256 costs no read. DCP fsyncs each
rank's files on that rank (`sync_files=True`). Each rank then writes its own manifest shard with those
digests (`manifest_shards.write_shard`); only a small record of it rides in the rank's write results,
which DCP gathers to the coordinator anyway; the coordinator's `finish` takes the records out again (so
`.metadata` is exactly what stock DCP writes) and keeps them in `digests` for rank 0's manifest
(`manifest_shards.write_manifest_v3`). Nothing of a shard is read back to commit it.

The hash is of exactly the bytes that reach the file, and it runs beside the write, not on the writing
thread: each write is copied, a cache-sized chunk at a time, into a buffer that only this stream
touches; the writing thread hands that buffer to a hashing thread (hashlib releases the GIL) and writes
it to the file meanwhile; a buffer is reused only once both are done with it (a few are in flight).
Hashing the caller's memory and then writing it would read it twice; if it changed in between (a save
that reads live tensors while training goes on: checkpoint/unstaged.py) the digest would describe bytes
that were never written, and a later resume would blame the disk ("corrupted") for what the save did.
The copy reads memory once; hash and write read the same copy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from concurrent.futures import Future as ThreadFuture
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem, _StorageInfo, _StorageWriterTransforms
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from truestep.checkpoint.catalog import rank_state_name
from truestep.checkpoint.hash_counters import count
from truestep.checkpoint.manifest_shards import ShardRecord, write_shard
from truestep.core.fsio import open_for_write
from truestep.faults.hooks import fault_point

CHUNK_BYTES = 1 << 20
"""Bytes copied, hashed and written at a time (fits a core's cache)."""
IN_FLIGHT = 4
"""Chunks a stream may have handed to the hashing thread and not got back (bounds its buffers)."""
INLINE_BYTES = 64 << 10
"""A write this small with nothing in flight is hashed on the writing thread: a thread hop costs more."""
_pool = threading.local()
"""Each writing thread's reusable chunk buffers."""

ItemDigests = dict[str, list[list[Any]]]
"""file name -> [[offset, length, sha256], ...]: the items of one rank's manifest shard."""


class _NoFollowFileSystem(FileSystem):
    """DCP's file system with writes that never follow a symlink nor open a FIFO (core/fsio.py): a link
    planted at `step_XXXXXXXX/__0_0.distcp` is refused, not written through."""

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[IO[bytes]]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with open_for_write(Path(path)) as stream:
            yield stream


class _HashingItemStream(io.IOBase):
    """One item's bytes on their way into the shard file: copied, hashed on `hasher` while the copy is
    written, and counted. `close` waits for the hash, records the digest and flushes, but leaves the shared
    file open (DCP appends the next item). Without a `hasher` the stream runs a hashing thread of its own."""

    def __init__(
        self,
        raw: IO[bytes],
        index: MetadataIndex,
        record: Callable[[MetadataIndex, str, int], None],
        hasher: Executor | None = None,
    ):
        super().__init__()
        self._raw = raw
        self._index = index
        self._record = record
        self._own_hasher = hasher is None
        self._hasher = hasher or ThreadPoolExecutor(1, thread_name_prefix="truestep-hash")
        self._hash = hashlib.sha256()
        self._written = 0
        self._in_flight: deque[tuple[ThreadFuture[None], memoryview]] = deque()
        self._free: list[memoryview] = getattr(_pool, "buffers", None) or []
        _pool.buffers = []  # this stream's until close (a thread writes one item at a time)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, view.nbytes, CHUNK_BYTES):
            part = view[start : start + CHUNK_BYTES]
            buffer = self._buffer()
            copy = buffer[: part.nbytes]
            copy[:] = part  # one read of the caller's memory; hash and file get the same bytes
            if part.nbytes < INLINE_BYTES and not self._in_flight:
                self._hash.update(copy)
                self._free.append(buffer)
            else:
                self._in_flight.append((self._hasher.submit(self._hash.update, copy), buffer))
            self._write_all(copy)  # while the hashing thread reads the same copy
        self._written += view.nbytes
        return view.nbytes

    def _buffer(self) -> memoryview:
        """A chunk buffer neither the file nor the hash still reads: a free one, a new one while fewer
        than IN_FLIGHT are in flight, else the oldest once its hash is done."""
        if self._free:
            return self._free.pop()
        if len(self._in_flight) < IN_FLIGHT:
            return memoryview(bytearray(CHUNK_BYTES))
        hashed, buffer = self._in_flight.popleft()
        hashed.result()
        return buffer

    def _drain(self) -> None:
        while self._in_flight:
            hashed, buffer = self._in_flight.popleft()
            hashed.result()
            self._free.append(buffer)

    def _write_all(self, data: memoryview) -> None:
        """The whole chunk into the file (a raw stream may take less than it is given)."""
        while data.nbytes:
            taken = self._raw.write(data)
            if not taken:  # None (would block) or 0: a regular file never does this; do not spin
                raise OSError(f"{self._index.fqn}: the shard file took no bytes")
            data = data[taken:]

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._drain()
            self._raw.flush()
            self._record(self._index, self._hash.hexdigest(), self._written)
            count("while_writing", self._written)
        finally:
            _pool.buffers = self._free[:IN_FLIGHT]
            if self._own_hasher:
                self._hasher.shutdown()
            super().close()


class _HashingTransforms(_StorageWriterTransforms):
    """DCP's per-item stream hook with no transform of the bytes (so no descriptor in the metadata)."""

    def __init__(self, record: Callable[[MetadataIndex, str, int], None]) -> None:
        super().__init__(())
        self._record = record
        self.hasher: Executor | None = None
        """The hashing thread of the write under way (ShardWriter.write_data)."""

    def transform_save_stream(
        self, write_item: WriteItem, raw_stream: io.IOBase
    ) -> tuple[IO[bytes], list[str]]:
        stream = _HashingItemStream(raw_stream, write_item.index, self._record, self.hasher)  # type: ignore[arg-type]
        return stream, []


class ShardWriter(FileSystemWriter):
    """FileSystemWriter hashing in the stream (module docstring). Each rank writes its manifest shard
    once its items are written (checkpoint/manifest_shards.py); `digests` is set on the coordinator once
    `finish` ran (after every rank's write results were gathered)."""

    def __init__(self, path: Path, step: int) -> None:
        super().__init__(path, sync_files=True)
        self.fs = _NoFollowFileSystem()
        self.step = step
        self.transforms = _HashingTransforms(self._record)
        self._lock = threading.Lock()
        self._hashed: dict[MetadataIndex, tuple[str, int]] = {}
        self.digests: list[ShardRecord] | None = None
        """On the coordinator once `finish` ran: every rank's manifest-shard record, for rank 0's commit."""

    def _record(self, index: MetadataIndex, sha256: str, nbytes: int) -> None:
        with self._lock:
            self._hashed[index] = (sha256, nbytes)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        with ThreadPoolExecutor(1, thread_name_prefix="truestep-hash") as hasher:
            self.transforms.hasher = hasher
            try:
                written = super().write_data(plan, planner)
                written.wait()
            finally:
                self.transforms.hasher = None
        fault_point("save:mid-shards", step=self.step)
        rank = _plan_rank(plan)
        items: ItemDigests = {}
        for result in written.value():
            sha256, nbytes = self._hashed[result.index]
            info = result.storage_data
            if nbytes != info.length:  # the stream is not what DCP says it wrote: say so
                raise RuntimeError(f"{result.index.fqn}: hashed {nbytes} bytes, DCP recorded {info.length}")
            items.setdefault(info.relative_path, []).append([info.offset, info.length, sha256])
        record = write_shard(self.path, self.step, rank, items, [rank_state_name(rank)]) if items else None
        # The record rides to the coordinator with this rank's first write result (DCP gathers them).
        results = [
            dataclasses.replace(result, storage_data=(result.storage_data, record if i == 0 else None))
            for i, result in enumerate(written.value())
        ]
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        records: list[ShardRecord] = []
        plain: list[list[WriteResult]] = []
        for rank_results in results:
            plain.append([])
            for result in rank_results:
                info, record = result.storage_data
                assert isinstance(info, _StorageInfo)
                if record is not None:
                    records.append(record)
                plain[-1].append(dataclasses.replace(result, storage_data=info))
        super().finish(metadata, plain)
        self.digests = records


def _plan_rank(plan: SavePlan) -> int:
    """The rank whose plan this is, as DCP numbers it in the file names it gives (`__{rank}_{n}.distcp`)."""
    prefix = getattr(plan.storage_data, "prefix", "")
    match = re.fullmatch(r"__(\d+)_", prefix)
    if match is None:
        raise RuntimeError(f"DCP gave this rank's files the prefix {prefix!r}, not __RANK_")
    return int(match.group(1))
