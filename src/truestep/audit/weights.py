"""The digest of a run's final weights file (`--weights PATH`): safetensors or a torch state dict, read
as bytes, never unpickled.

safetensors: SHA-256 over every tensor's name, dtype, shape and raw bytes, in name order (the header's
free-form metadata is left out). A torch file (torch.save's zip): SHA-256 over every archive record's
name below the archive's own folder (torch names that folder after the file) and its bytes, in name
order; torch writes records uncompressed, and a compressed one is refused (a zip bomb would be).
Two files digest equal iff the saved tensors are bit-identical (for torch files: saved by the same code).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from pathlib import Path

from truestep.core.errors import RefusedError
from truestep.core.fsio import open_regular

MAX_HEADER = 100 << 20
"""safetensors' own bound on its JSON header."""
CHUNK = 8 << 20


class WeightsFileError(RefusedError):
    """A weights file that is missing, not a regular file, or neither safetensors nor a torch zip."""


def _stream(f, length: int, h: hashlib._Hash) -> None:  # noqa: ANN001
    while length > 0:
        data = f.read(min(CHUNK, length))
        if not data:
            raise WeightsFileError(f"{f.name}: ends inside a tensor")
        h.update(data)
        length -= len(data)


def _safetensors(f, size: int, path: Path) -> str:  # noqa: ANN001
    (length,) = struct.unpack("<Q", f.read(8))
    if length > min(MAX_HEADER, size - 8):
        raise WeightsFileError(f"{path}: not a safetensors file (header of {length} bytes)")
    try:
        header = json.loads(f.read(length))
        entries = {k: v for k, v in header.items() if k != "__metadata__"}
        spans = {k: (int(v["data_offsets"][0]), int(v["data_offsets"][1])) for k, v in entries.items()}
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
        raise WeightsFileError(f"{path}: not a safetensors file ({err})") from err
    base = 8 + length
    h = hashlib.sha256()
    for name in sorted(entries):
        start, end = spans[name]
        if not 0 <= start <= end <= size - base:
            raise WeightsFileError(f"{path}: tensor {name!r} lies outside the file")
        h.update(json.dumps([name, entries[name].get("dtype"), entries[name].get("shape")]).encode())
        f.seek(base + start)
        _stream(f, end - start, h)
    return h.hexdigest()


def _torch_zip(f, path: Path) -> str:  # noqa: ANN001
    try:
        archive = zipfile.ZipFile(f)
    except zipfile.BadZipFile as err:
        raise WeightsFileError(f"{path}: neither safetensors nor a torch zip file ({err})") from err
    h = hashlib.sha256()
    with archive:
        for info in sorted(archive.infolist(), key=lambda i: i.filename):
            if info.compress_type != zipfile.ZIP_STORED:
                raise WeightsFileError(f"{path}: record {info.filename!r} is compressed; torch writes none")
            h.update(info.filename.partition("/")[2].encode() + b"\0")
            with archive.open(info) as record:
                _stream(record, info.file_size, h)
    return h.hexdigest()


def weights_digest(path: Path) -> str:
    """`sha256:<hex>` of the tensors in `path` (WeightsFileError when it cannot be read as weights)."""
    try:
        fd = open_regular(path)
    except OSError as err:
        raise WeightsFileError(f"weights file {path}: {err.strerror or err}") from err
    with open(fd, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        magic = f.read(4)
        f.seek(0)
        if magic == b"PK\x03\x04":
            return "sha256:" + _torch_zip(f, path)
        if size < 8:
            raise WeightsFileError(f"{path}: {size} bytes is no weights file")
        return "sha256:" + _safetensors(f, size, path)
