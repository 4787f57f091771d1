"""DCP reading without arbitrary unpickling, outside paths, hangs or believed sizes.

Stock DCP `pickle.load`s the `.metadata` file, `torch.load(weights_only=False)`s every non-tensor item,
opens whatever path the metadata names and copies a stored tensor into its target in whatever dtype it
was stored. Here:

- `.metadata` is read as a bounded regular file (never a FIFO or symlink) and goes through an unpickler
  that resolves only DCP's own metadata classes and a few inert torch/pathlib types; the result must pass
  `dcp_checks.check_metadata` (plain storage names of regular files inside the checkpoint, byte ranges
  inside them, declared sizes backed by stored bytes);
- data is read only from those files (opened with no-follow, non-blocking semantics), every stored tensor
  must have exactly the dtype and chunk shape the metadata declares, and byte items load with
  `weights_only=True`;
- with `check_items` (a resume), every item's bytes are read once and must match the SHA-256 its writer
  recorded in the manifest (v2, v3) before anything deserializes them, so a flipped byte is found by the
  rank that reads it, whatever the layout, and never reaches a tensor; good items stream into their
  targets at once (`verified_read.py`), and DCP gathers a failure to every rank at the end
  (`DigestMismatchError`): the caller then discards the targets (an older checkpoint overwrites them, a
  fresh start re-initializes them).

Anything else is refused with `UnsafeCheckpointError` (a `CheckpointContentError`: the checkpoint itself
is bad) before it can execute, hang or allocate. `single_process()` silences the one DCP warning that says
it runs without a process group, around the calls that do so on purpose.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.utils import _create_file_view
from torch.futures import Future

from truestep.checkpoint.catalog import DCP_METADATA
from truestep.checkpoint.dcp_checks import MetadataProblem, check_metadata
from truestep.checkpoint.errors import CheckpointContentError, TensorMismatchError
from truestep.checkpoint.verified_read import BufferReader, stream_verified
from truestep.core.errors import TruestepError, causes
from truestep.core.fsio import OversizeFileError, UnsafePathError, open_regular, plain_file_name, read_regular
from truestep.telemetry import startup

MAX_METADATA_BYTES = 1 << 30
"""DCP metadata of a 70B model on thousands of ranks is tens of MB; beyond this it is not metadata."""


SINGLE_PROCESS_WARNING = r"torch.distributed is disabled, unavailable or uninitialized"


def silence_single_process_saves() -> None:
    """For a process that trains without a process group: DCP's per-save warning says exactly what we
    intend, and an async save runs DCP on a writer thread, outside any `single_process()` scope (the
    warning landed inside the progress bar at every save). Process-wide, so called only there."""
    warnings.filterwarnings("ignore", message=SINGLE_PROCESS_WARNING)


class OneLineDcpLogs(logging.Filter):
    """DCP's loader logs a missing `.metadata` to the root logger with its whole traceback (`exc_info`)
    before it goes on or raises; what truestep does about it is said by truestep (one line, the
    traceback in events.jsonl). So a DCP record keeps its message and the exception's one line, and
    loses the traceback: the console and the experiment's job logs hold no raw PyTorch traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if err is not None and DCP_SOURCE in record.pathname.replace(os.sep, "/"):
            first = str(err).splitlines()[0] if str(err) else ""
            record.msg, record.args = f"{record.getMessage()} ({type(err).__name__}: {first})", None
            record.exc_info, record.exc_text = None, None
        return True


DCP_SOURCE = "torch/distributed/checkpoint/"
"""Where the records `OneLineDcpLogs` shortens come from."""
_ONE_LINE = OneLineDcpLogs()
logging.getLogger().addFilter(_ONE_LINE)  # DCP's state_dict_loader logs through the root logger


@contextmanager
def single_process() -> Iterator[None]:
    """DCP warns that it runs without a process group: exactly the intent where this is used."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SINGLE_PROCESS_WARNING)
        yield


class UnsafeCheckpointError(CheckpointContentError):
    """A checkpoint file asked for something truestep does not allow (code, outside paths, sizes or
    dtypes its own bytes contradict)."""


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
    """Unpickle DCP metadata with the allow-list (structure not yet checked: see `read_dcp_metadata`)."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpointError:
        raise
    except Exception as err:  # any malformed pickle is a corrupt checkpoint, said loudly
        raise UnsafeCheckpointError(f"checkpoint metadata is not valid DCP metadata: {err}") from err
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"checkpoint metadata holds {type(metadata).__name__}, not DCP Metadata")
    return metadata


def read_dcp_metadata(ckpt_dir: Path) -> Metadata:
    """The checked DCP metadata of `ckpt_dir`; UnsafeCheckpointError saying why it is unusable, or
    FileNotFoundError when there is none."""
    path = Path(ckpt_dir) / DCP_METADATA
    try:
        data = read_regular(path, MAX_METADATA_BYTES)
    except (UnsafePathError, OversizeFileError) as err:
        raise UnsafeCheckpointError(
            f"{DCP_METADATA}: {err.strerror if isinstance(err, OSError) else err}"
        ) from None
    metadata = safe_load_metadata(data)
    try:
        return check_metadata(metadata, Path(ckpt_dir))
    except (MetadataProblem, TypeError, AttributeError, OverflowError) as err:
        raise UnsafeCheckpointError(f"{DCP_METADATA}: {err}") from err


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader that reads only checked metadata and only what it declares (module docstring)."""

    def __init__(self, path: str | os.PathLike, check_items: bool = False) -> None:
        super().__init__(path)
        self._declared: dict[str, TensorStorageMetadata] = {}
        self._check_items = check_items

    def read_metadata(self, *args: Any) -> Metadata:  # no **kwargs: never DCP's rank-local fallback
        metadata = read_dcp_metadata(Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._declared = {
            fqn: item
            for fqn, item in metadata.state_dict_metadata.items()
            if isinstance(item, TensorStorageMetadata)
        }

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        if self._check_items:
            self._load_verified(per_file, planner)
        else:
            self._load_streamed(per_file, planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _load_verified(self, per_file: dict[str, list[ReadItem]], planner: LoadPlanner) -> None:
        """Every item read once and hashed, deserialized into its targets as soon as its hash matched."""
        readers: dict[Any, list[ReadItem]] = {}
        for items in per_file.values():
            for item in items:
                readers.setdefault(item.storage_index, []).append(item)
        ranges = {
            name: list({i.storage_index: self._range(i) for i in items}.values())
            for name, items in per_file.items()
        }

        def consume(index: Any, data: memoryview) -> None:
            for item in readers[index]:
                self._load_item(BufferReader(data), item, planner)

        stream_verified(Path(self.path), ranges, consume)

    def _load_streamed(self, per_file: dict[str, list[ReadItem]], planner: LoadPlanner) -> None:
        """Each item deserialized straight from its file (its bytes were hashed whole before the load,
        or checksums are off)."""
        for name, items in per_file.items():
            if not plain_file_name(name):  # checked with the metadata; never open anything else
                raise UnsafeCheckpointError(f"storage path {name!r} is not a plain file name")
            try:
                fd = open_regular(Path(self.path) / name)
            except UnsafePathError as err:
                raise UnsafeCheckpointError(f"storage file {name}: {err.strerror}") from None
            with os.fdopen(fd, "rb") as stream:
                for item in items:
                    info = self.storage_data[item.storage_index]
                    self._load_item(_create_file_view(stream, info.offset, info.length), item, planner)

    def _range(self, item: ReadItem) -> tuple[Any, int, int]:
        info = self.storage_data[item.storage_index]
        return item.storage_index, info.offset, info.length

    def _load_item(self, view: Any, item: ReadItem, planner: LoadPlanner) -> None:
        fqn = item.storage_index.fqn
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, io.BytesIO(view.read(-1)))
            return
        try:
            stored = torch.load(view, map_location="cpu", weights_only=True)
        except Exception as err:  # UnpicklingError, EOFError, RuntimeError (zip): the bytes are bad
            raise UnsafeCheckpointError(
                f"{fqn}: stored bytes do not load: {type(err).__name__}: {err}"
            ) from err
        declared = self._declared.get(fqn)
        chunk = (
            next(
                (c for c in declared.chunks if tuple(c.offsets) == tuple(item.storage_index.offset or ())),
                None,
            )
            if declared
            else None
        )
        if not isinstance(stored, torch.Tensor) or declared is None or chunk is None:
            raise UnsafeCheckpointError(f"{fqn}: stored item is not the tensor chunk the metadata declares")
        if stored.dtype != declared.properties.dtype:
            raise UnsafeCheckpointError(
                f"{fqn}: stored as {str(stored.dtype).removeprefix('torch.')}, the metadata declares "
                f"{str(declared.properties.dtype).removeprefix('torch.')}"
            )
        if tuple(stored.shape) != tuple(chunk.sizes):
            raise UnsafeCheckpointError(
                f"{fqn}: stored chunk has shape {list(stored.shape)}, the metadata declares {list(chunk.sizes)}"
            )
        piece = narrow_tensor_by_index(stored, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != piece.size():
            raise TensorMismatchError(
                f"{fqn}: the checkpoint holds {list(piece.size())}, the model expects {list(target.size())}"
            )
        target.copy_(piece)
        planner.commit_tensor(item, target)


class SafeLoadPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except Exception as err:  # UnpicklingError for code, EOFError/RuntimeError for garbage
            raise UnsafeCheckpointError(f"checkpoint item {read_item.dest_index.fqn} refused: {err}") from err
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_dcp(state: dict[str, Any], ckpt_dir: Path, no_dist: bool = False, check_items: bool = False) -> None:
    """`dcp.load` through the safe reader and planner, into `state` in place (collective unless
    `no_dist`); `check_items`: hash every item read against the manifest's item digests. DCP wraps every rank's failure in a CheckpointException (a BaseException, its message a
    list of tracebacks); this re-raises the failure itself: a TruestepError (UnsafeCheckpointError,
    TensorMismatchError, ...) or an OSError as they are, anything else as it was raised."""
    try:
        with single_process(), startup.timed("load"):
            dcp.load(
                state,
                storage_reader=SafeFileSystemReader(ckpt_dir, check_items),
                planner=SafeLoadPlanner(),
                no_dist=no_dist,
            )
    except CheckpointException as err:
        raise dcp_failure(err) from err


def dcp_failure(err: CheckpointException) -> BaseException:
    """The failure inside DCP's CheckpointException: a TruestepError or OSError first, else the first.
    DCP gathers every rank's failure to every rank, so each raises the one of the rank that found it."""
    inner = [c for c in causes(err) if not isinstance(c, CheckpointException)]
    return next((c for c in inner if isinstance(c, TruestepError | OSError)), inner[0] if inner else err)
