"""Every tensor a checkpoint stores (model weights and optimizer state) as full CPU tensors, without a
process group and without unpickling: what the instrument needs to measure how far a run's parameters
and optimizer moments are from another run's at the same step.

Read through `safe_dcp` with `no_dist=True`, like `weights.py` (which reads the model weights only): DCP
reassembles whatever layout the checkpoint was saved with, so two runs saved at different layouts
compare tensor by tensor. Keys are DCP's flattened names: `model.<fqn>` for weights,
`optim.state.<fqn>.<name>` for optimizer state (AdamW: `exp_avg`, `exp_avg_sq`, `step`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from truestep.checkpoint.safe_dcp import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeCheckpointError,
    single_process,
)
from truestep.checkpoint.weights import TensorMeta, WeightsError

STATE_PREFIXES = ("model.", "optim.state.")
"""The stored state that shapes the trajectory: weights and per-parameter optimizer state."""


def stored_tensors(ckpt_dir: Path) -> dict[str, TensorMeta]:
    """DCP key -> (full shape, dtype) of every weight and optimizer-state tensor in the checkpoint."""
    try:
        metadata = SafeFileSystemReader(ckpt_dir).read_metadata()
    except UnsafeCheckpointError as err:
        raise WeightsError(f"{ckpt_dir}: {err}") from err
    except OSError as err:
        raise WeightsError(f"{ckpt_dir}: cannot read DCP metadata: {err}") from err
    found = {
        key: TensorMeta(tuple(item.size), item.properties.dtype)
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith(STATE_PREFIXES) and isinstance(item, TensorStorageMetadata)
    }
    return dict(sorted(found.items()))


def read_tensors(ckpt_dir: Path, meta: dict[str, TensorMeta]) -> dict[str, torch.Tensor]:
    """Full CPU tensors (stored dtype) for the keys of `meta` (a subset of `stored_tensors`)."""
    into = {key: torch.empty(m.shape, dtype=m.dtype) for key, m in meta.items()}
    if not into:
        return into
    try:
        with single_process():
            dcp.load(
                into,
                storage_reader=SafeFileSystemReader(ckpt_dir),
                planner=SafeLoadPlanner(),
                no_dist=True,
            )
    except UnsafeCheckpointError as err:
        raise WeightsError(f"{ckpt_dir}: {err}") from err
    except (OSError, RuntimeError, ValueError, CheckpointException) as err:  # DCP's is a BaseException
        raise WeightsError(f"{ckpt_dir}: cannot read tensors: {err}") from err
    return into
