"""`truestep export --to torch`: the model weights of a checkpoint as one plain `torch.save` state dict
with truestep's own parameter names, exactly the keys of `Transformer(cfg).state_dict()` (loads with
`Transformer(cfg).load_state_dict(torch.load(FILE, weights_only=True), strict=True)`, tied or not).

The file is new: an existing file (or symlink) at the destination is refused, like a non-empty directory
for `--to hf`, and the content appears all at once (`fsio.write_new_file`). It is written through a Python
file object, so a full disk says "no space left on device", not torch's "unexpected pos".
"""

from __future__ import annotations

import os
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
from truestep.core.fsio import write_new_file
from truestep.interop.dtypes import cast_for_export, dtype_name
from truestep.interop.errors import InteropError


def export_torch(
    ckpt: Path, file: Path, checksums: bool = True, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """Consolidate the model weights of a (verified) checkpoint into one `torch.save` state dict (`dtype`)."""
    file = Path(file)
    if os.path.lexists(file):
        raise InteropError(
            f"{file} already exists; refusing to overwrite it (remove it or choose another name)"
        )
    ckpt_dir = find_verified(ckpt, checksums)
    cfg = read_model_config(ckpt_dir)
    meta = model_tensor_meta(ckpt_dir)
    check_config_fits(ckpt_dir, cfg, meta)
    tensors = load_model_tensors(ckpt_dir, meta=meta)
    state = {fqn: cast_for_export(t, dtype, fqn) for fqn, t in tensors.items()}
    if cfg.tie_embeddings:
        # The module's state_dict names the tied weight twice; a checkpoint may store it once (an
        # imported one always does). One tensor under both names: `load_state_dict(strict=True)` finds
        # every key, and torch.save writes the shared storage once.
        state["output.weight"] = state["tok_embeddings.weight"]
    file.parent.mkdir(parents=True, exist_ok=True)
    write_new_file(file, lambda f: torch.save(state, f))
    return {
        "checkpoint": str(ckpt_dir),
        "file": str(file),
        "tensors": len(state),
        "bytes": file.stat().st_size,
        "dtype": dtype_name(dtype),
    }
