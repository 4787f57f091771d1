"""Interop: truestep checkpoints <-> Hugging Face Llama directories and plain torch state dicts
(see docs/interop.md). Reading a checkpoint's weights and `init_from` live in the checkpoint room
(`checkpoint/weights.py`, `checkpoint/init_from.py`); this room converts formats."""

from truestep.interop.errors import InteropError
from truestep.interop.hf import export_hf, hf_config, import_hf, model_config_from_hf, parse_size
from truestep.interop.names import from_hf, to_hf
from truestep.interop.torch_file import export_torch

__all__ = [
    "InteropError",
    "export_hf",
    "export_torch",
    "from_hf",
    "hf_config",
    "import_hf",
    "model_config_from_hf",
    "parse_size",
    "to_hf",
]
