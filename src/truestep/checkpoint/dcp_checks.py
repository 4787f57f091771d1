"""What DCP metadata may claim before a single byte it points at is read.

DCP's `.metadata` is input like any other file of a checkpoint: it names, for every stored item, the file
and byte range that holds it (`storage_data`), and for every tensor its dtype, full size and chunks. Stock
DCP believes all of it: a storage path `../step_00000002/__0_0.distcp` loads another step's weights, a
path naming a FIFO blocks the loader forever, and a declared size of 10^12 elements is allocated before
anything is compared. `check_metadata` accepts a metadata object only if

- every structure has the types DCP writes (dicts, `MetadataIndex`, `_StorageInfo`, `torch.Size`, ...);
- every storage path is a plain file name (no `/`, no `..`) of a regular file in the checkpoint
  directory (a symlink, FIFO or device is refused by `lstat`, never opened), and every byte range lies
  inside that file; no storage transforms (truestep never writes them);
- every tensor's chunks lie inside its declared size and add up to exactly its element count, and each
  chunk has a storage entry at least as long as the chunk's raw bytes. So the bytes a checkpoint declares
  are bounded by the bytes it actually has on disk, and a loader may allocate what the metadata declares.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from truestep.core.fsio import entry_kind, plain_file_name


class MetadataProblem(ValueError):
    """What is wrong with a DCP metadata object (the caller adds where)."""


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, torch.Size | tuple | list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise MetadataProblem(f"{what} is not a list of non-negative integers: {value!r:.80}")
    return tuple(value)


def storage_files(metadata: Metadata) -> set[str]:
    """The file names `storage_data` points at (call after `check_metadata`)."""
    return {info.relative_path for info in metadata.storage_data.values()}


def _check_storage(storage: Any, ckpt_dir: Path) -> dict[MetadataIndex, _StorageInfo]:
    if not isinstance(storage, dict) or not storage:
        raise MetadataProblem("storage_data is empty or not a table")
    sizes: dict[str, int] = {}
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise MetadataProblem(f"storage_data entry {index!r:.80} is malformed")
        name = info.relative_path
        if not plain_file_name(name):
            raise MetadataProblem(
                f"{index.fqn}: storage path {name!r:.120} is not a plain file name inside the checkpoint"
            )
        if getattr(info, "transform_descriptors", None):
            raise MetadataProblem(
                f"{index.fqn}: storage transforms {info.transform_descriptors!r:.80} refused"
            )
        if name not in sizes:
            path = ckpt_dir / name
            try:
                mode, size = os.lstat(path).st_mode, os.lstat(path).st_size
            except FileNotFoundError:
                raise MetadataProblem(f"{index.fqn}: storage file {name} does not exist") from None
            if not stat.S_ISREG(mode):
                raise MetadataProblem(
                    f"{index.fqn}: storage file {name} is {entry_kind(path)}, not a regular file"
                )
            sizes[name] = size
        offset, length = info.offset, info.length
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, length)):
            raise MetadataProblem(
                f"{index.fqn}: byte range {offset!r:.40}+{length!r:.40} is not two integers >= 0"
            )
        if offset + length > sizes[name]:
            raise MetadataProblem(
                f"{index.fqn}: bytes {offset}..{offset + length} are beyond the end of {name} ({sizes[name]} bytes)"
            )
    return storage


def _check_tensor(fqn: str, item: TensorStorageMetadata, storage: dict[MetadataIndex, _StorageInfo]) -> None:
    properties = getattr(item, "properties", None)
    if not isinstance(properties, TensorProperties) or not isinstance(properties.dtype, torch.dtype):
        raise MetadataProblem(f"{fqn}: no valid dtype")
    size = _ints(getattr(item, "size", None), f"{fqn}: size")
    chunks = getattr(item, "chunks", None)
    if not isinstance(chunks, list) or (not chunks and math.prod(size) > 0):
        raise MetadataProblem(f"{fqn}: no chunk list")
    covered = 0
    itemsize = properties.dtype.itemsize
    for chunk in chunks:
        if not isinstance(chunk, ChunkStorageMetadata):
            raise MetadataProblem(f"{fqn}: malformed chunk {chunk!r:.80}")
        offsets = _ints(chunk.offsets, f"{fqn}: chunk offsets")
        sizes = _ints(chunk.sizes, f"{fqn}: chunk sizes")
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise MetadataProblem(f"{fqn}: a chunk has {len(sizes)} dimensions, the tensor {len(size)}")
        if any(o + s > d for o, s, d in zip(offsets, sizes, size, strict=True)):
            raise MetadataProblem(
                f"{fqn}: chunk at {list(offsets)} of size {list(sizes)} exceeds {list(size)}"
            )
        info = storage.get(MetadataIndex(fqn, offsets))
        if info is None:
            raise MetadataProblem(f"{fqn}: chunk at {list(offsets)} has no storage entry")
        numel = math.prod(sizes)
        if info.length < numel * itemsize:
            raise MetadataProblem(
                f"{fqn}: chunk at {list(offsets)} declares {numel * itemsize} bytes of "
                f"{str(properties.dtype).removeprefix('torch.')} but stores {info.length}"
            )
        covered += numel
    if covered != math.prod(size):
        raise MetadataProblem(
            f"{fqn}: chunks hold {covered} elements, the declared size {list(size)} has {math.prod(size)}"
        )


def check_metadata(metadata: Any, ckpt_dir: Path) -> Metadata:
    """`metadata` if it is safe to load from `ckpt_dir` (see the module docstring), else MetadataProblem."""
    if not isinstance(metadata, Metadata):
        raise MetadataProblem(f"holds {type(metadata).__name__}, not DCP Metadata")
    items = metadata.state_dict_metadata
    if not isinstance(items, dict) or not items:
        raise MetadataProblem("state_dict_metadata is empty or not a table")
    storage = _check_storage(metadata.storage_data, Path(ckpt_dir))
    for fqn, item in items.items():
        if not isinstance(fqn, str):
            raise MetadataProblem(f"key {fqn!r:.80} is not a string")
        if isinstance(item, TensorStorageMetadata):
            _check_tensor(fqn, item, storage)
        elif isinstance(item, BytesStorageMetadata):
            if MetadataIndex(fqn) not in storage:
                raise MetadataProblem(f"{fqn}: no storage entry")
        else:
            raise MetadataProblem(f"{fqn}: unknown item type {type(item).__name__}")
    planner_data = getattr(metadata, "planner_data", None)
    if planner_data is not None and not isinstance(planner_data, dict):
        raise MetadataProblem("planner_data is not a table")
    return metadata
