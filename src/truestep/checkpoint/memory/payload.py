"""The bytes of one snapshot copy: every local tensor of the rank's model and optimizer state dicts (the
same `Checkpointable.dcp_state_dict` a disk save writes), back to back, described by a table; hashed
with SHA-256 as they are written and checked before a single byte is loaded.

A payload is written straight from the live tensors into the holder's file (one copy, into host memory)
and read straight from that file (a memory map) or from the bytes a buddy sent into the targets: no
intermediate copy of the whole state on the survivor's path.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor

CHUNK = 64 << 20
Tensors = list[tuple[str, str, torch.Tensor]]
"""(part, key, local tensor) in a fixed order."""


def _walk(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from _walk(value[key], f"{path}/{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}/{index}")


def tensors_of(state: dict[str, Any]) -> Tensors:
    """The local tensors of a `dcp_state_dict` ({"model": ..., "optim": ...}), in a fixed order."""
    found: Tensors = []
    for part in ("model", "optim"):
        if part in state:
            for key, tensor in _walk(state[part], ""):
                local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
                found.append((part, key, local))
    return found


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 CPU tensor (a view when it is contiguous on the CPU)."""
    flat = tensor.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    return flat.view(torch.uint8).cpu()


def table_of(tensors: Tensors) -> tuple[list[dict[str, Any]], int]:
    table, offset = [], 0
    for part, key, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        entry = {"part": part, "key": key, "dtype": str(tensor.dtype), "shape": list(tensor.shape)}
        table.append({**entry, "offset": offset, "nbytes": nbytes})
        offset += nbytes
    return table, offset


def write_payload(path: Path, tensors: Tensors) -> tuple[str, str]:
    """Write the tensors' bytes to `path` (never through a symlink). Returns the SHA-256 of exactly what
    was written, and the model digest of its model part (`model_digest`), from the same pass."""
    h, model = hashlib.sha256(), hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        for part, key, tensor in tensors:
            view = memoryview(_bytes_of(tensor).numpy())
            h.update(view)
            if part == "model":
                model.update(key.encode())
                model.update(view)
            f.write(view)
    return h.hexdigest(), model.hexdigest()


def model_digest(tensors: Tensors) -> str:
    """SHA-256 over the model part (each key, then its bytes): what a restore checks the live model
    against, end to end (the payload's own SHA-256 checks only the bytes that travelled)."""
    h = hashlib.sha256()
    for part, key, tensor in tensors:
        if part == "model":
            h.update(key.encode())
            h.update(memoryview(_bytes_of(tensor).numpy()))
    return h.hexdigest()


def write_bytes(path: Path, data: np.ndarray) -> None:
    """A payload received from a buddy, kept as this rank's own copy (never written through a symlink)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(memoryview(data))


def map_file(path: Path, nbytes: int) -> np.ndarray:
    """The file's bytes as a private (copy-on-write) memory map: read without copying, never written back."""
    if nbytes == 0:
        return np.zeros(0, dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        mapped = mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return np.frombuffer(mapped, dtype=np.uint8)


def sha256_of(data: np.ndarray) -> str:
    h = hashlib.sha256()
    for start in range(0, len(data), CHUNK):
        h.update(data[start : start + CHUNK])
    return h.hexdigest()


class PayloadMismatch(Exception):
    """The payload does not fit the state it is to be loaded into (another model or layout)."""


def load_payload(data: np.ndarray, table: list[dict[str, Any]], targets: Tensors) -> None:
    """Copy each entry's bytes into the matching target tensor (same part, key, dtype and shape)."""
    wanted = {(e["part"], e["key"]): e for e in table}
    for part, key, target in targets:
        entry = wanted.get((part, key))
        if entry is None:
            raise PayloadMismatch(f"the snapshot holds no {part}{key}")
        if entry["dtype"] != str(target.dtype) or entry["shape"] != list(target.shape):
            raise PayloadMismatch(
                f"{part}{key}: the snapshot holds {entry['dtype']}{entry['shape']}, the rank "
                f"{target.dtype}{list(target.shape)}"
            )
        source = torch.from_numpy(data[entry["offset"] : entry["offset"] + entry["nbytes"]])
        with torch.no_grad():
            if target.is_contiguous():
                target.view(-1).view(torch.uint8).copy_(source)
            else:
                target.copy_(source.view(target.dtype).reshape(target.shape))
