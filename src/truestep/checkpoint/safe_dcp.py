"""DCP reading without arbitrary unpickling.

Stock DCP `pickle.load`s the `.metadata` file and `torch.load(weights_only=False)`s every non-tensor
item. A planted payload would run code. Here `.metadata` goes through an unpickler that resolves only
DCP's own metadata classes and a few inert torch/pathlib types, and byte items load with
`weights_only=True`. Anything else is refused with `UnsafeCheckpointError` before it can execute.

`single_process()` silences the one DCP warning that says it runs without a process group, around the
calls that do so on purpose (a one-process run, export, import); nothing is filtered at import time.
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem


@contextmanager
def single_process() -> Iterator[None]:
    """DCP warns that it runs without a process group: exactly the intent where this is used."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file asked to import something truestep does not allow."""


_ALLOWED = {
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
}
_ALLOWED_DCP_METADATA = {
    "Metadata",
    "MetadataIndex",
    "StorageMeta",
    "TensorProperties",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "ChunkStorageMetadata",
    "_MEM_FORMAT_ENCODING",
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            (module, name) in _ALLOWED
            or (module == "torch.distributed.checkpoint.metadata" and name in _ALLOWED_DCP_METADATA)
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise UnsafeCheckpointError(f"checkpoint metadata references {module}.{name}; refused")
        return super().find_class(module, name)


def safe_load_metadata(data: bytes) -> Metadata:
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpointError:
        raise
    except Exception as err:  # any malformed pickle is a corrupt checkpoint, said loudly
        raise UnsafeCheckpointError(f"checkpoint metadata is not valid DCP metadata: {err}") from err
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"checkpoint metadata holds {type(metadata).__name__}, not DCP Metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = safe_load_metadata(stream.read())
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise UnsafeCheckpointError(f"checkpoint item {read_item.dest_index.fqn} refused: {err}") from err
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
