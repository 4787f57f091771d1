"""A checkpoint as a ready-to-run model: verified, its recorded config checked against the stored shapes
before anything is allocated, weights loaded into a plain (unsharded) Transformer on the CPU."""

from __future__ import annotations

from pathlib import Path

from truestep.checkpoint.resolver import find_verified
from truestep.checkpoint.weights import (
    check_config_fits,
    load_model_tensors,
    model_tensor_meta,
    read_model_config,
)
from truestep.model.llama import Transformer


def load_checkpoint_model(ckpt: Path, checksums: bool = True) -> tuple[Transformer, Path]:
    """(model in eval mode, the step directory used) for a step directory, run directory or checkpoint
    root (newest verified), training or imported alike."""
    ckpt_dir = find_verified(Path(ckpt), checksums)
    cfg = read_model_config(ckpt_dir)
    check_config_fits(ckpt_dir, cfg, model_tensor_meta(ckpt_dir))
    model = Transformer(cfg)
    load_model_tensors(ckpt_dir, into=model.state_dict())
    return model.eval(), ckpt_dir
