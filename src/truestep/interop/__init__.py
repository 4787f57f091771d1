"""Interop: truestep checkpoints <-> Hugging Face Llama directories and plain torch state dicts,
torchtitan llama3 checkpoints -> truestep, `checkpoint.init_from`, and loading a checkpoint to generate
from (see docs/interop.md)."""

from truestep.interop.ckpt import (
    INTEROP_FILE,
    export_torch,
    load_model_tensors,
    model_tensor_meta,
    read_model_config,
    verified_checkpoint,
)
from truestep.interop.errors import InteropError
from truestep.interop.hf import export_hf, hf_config, import_hf, model_config_from_hf, parse_size
from truestep.interop.init import load_init_weights
from truestep.interop.names import from_hf, to_hf
from truestep.interop.torchtitan import import_torchtitan

__all__ = [
    "INTEROP_FILE",
    "InteropError",
    "export_hf",
    "export_torch",
    "from_hf",
    "hf_config",
    "import_hf",
    "import_torchtitan",
    "load_init_weights",
    "load_model_tensors",
    "model_config_from_hf",
    "model_tensor_meta",
    "parse_size",
    "read_model_config",
    "to_hf",
    "verified_checkpoint",
]
