"""`truestep export --to torch`: the model weights of a checkpoint as one plain `torch.save` state dict
with truestep's own parameter names (loads with `torch.load(FILE, weights_only=True)`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from truestep.checkpoint.resolver import find_verified
from truestep.checkpoint.weights import (
    check_config_fits,
    load_model_tensors,
    model_tensor_meta,
    read_model_config,
)
from truestep.interop.dtypes import cast_for_export, dtype_name


def export_torch(
    ckpt: Path, file: Path, checksums: bool = True, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """Consolidate the model weights of a (verified) checkpoint into one `torch.save` state dict (`dtype`)."""
    ckpt_dir = find_verified(ckpt, checksums)
    cfg = read_model_config(ckpt_dir)
    meta = model_tensor_meta(ckpt_dir)
    check_config_fits(ckpt_dir, cfg, meta)
    tensors = load_model_tensors(ckpt_dir, meta=meta)
    state = {fqn: cast_for_export(t, dtype, fqn) for fqn, t in tensors.items()}
    if cfg.tie_embeddings and "output.weight" in state:
        state["output.weight"] = state["tok_embeddings.weight"]  # tied as in the module's state_dict
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=file.parent)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, file)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return {
        "checkpoint": str(ckpt_dir),
        "file": str(file),
        "tensors": len(state),
        "bytes": file.stat().st_size,
        "dtype": dtype_name(dtype),
    }
