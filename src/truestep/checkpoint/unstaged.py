"""An async save that takes no staged copy, on purpose: the class of bug where the background writer
reads the live parameter and optimizer tensors while training (or a fault) goes on mutating them. Only
behind the test switch `checkpoint.emulate_unstaged_async_save`; it exists so that the restored-digest
check (train/restored_digest.py) can be shown to catch such a save.

The write starts when the saver releases it, after the `save:writing` fault point: what the writer reads
is then whatever the tensors hold at that moment, deterministically, instead of a race.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.tensor import DTensor

from truestep.checkpoint.safe_dcp import single_process


def unstaged_async_save(state: dict[str, Any], writer: FileSystemWriter) -> tuple[Future, Callable[[], None]]:
    """Start a writer thread over the live `state` (no copy); it waits for the returned release()."""
    future: Future = Future()
    gate = threading.Event()

    def write() -> None:
        gate.wait()
        try:
            with single_process():
                dcp.save(state, storage_writer=writer)
        except BaseException as err:  # handed to whoever waits on the future, as DCP's own does
            future.set_exception(err)
        else:
            future.set_result(None)

    threading.Thread(target=write, name="truestep-unstaged-save", daemon=True).start()
    return future, gate.set


def mutate_in_place(state: dict[str, Any], delta: float = 1e-3) -> int:
    """Add `delta` to every floating-point tensor the save holds (parameters and optimizer moments share
    storage with the live ones): what an optimizer step does while an unstaged write is in flight.
    Returns how many tensors changed."""
    changed = 0
    with torch.no_grad():
        for leaf in _leaves(state):
            local = leaf.to_local() if isinstance(leaf, DTensor) else leaf
            if local.is_floating_point() and local.numel() > 0:
                local.add_(delta)
                changed += 1
    return changed


def _leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _leaves(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _leaves(v)]
    return []
