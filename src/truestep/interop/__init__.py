"""Interop: format conversion between truestep checkpoints and Hugging Face Llama directories, plain
torch state dicts and torchtitan llama3 checkpoints, and loading a checkpoint to generate from (see
docs/interop.md). Reading a checkpoint's weights and `init_from` live in the checkpoint room
(`checkpoint/weights.py`, `checkpoint/init_from.py`)."""

from truestep.interop.errors import InteropError
from truestep.interop.hf import export_hf, hf_config, import_hf, model_config_from_hf, parse_size
from truestep.interop.names import from_hf, to_hf
from truestep.interop.torch_file import export_torch
from truestep.interop.torchtitan import import_torchtitan

__all__ = [
    "InteropError",
    "export_hf",
    "export_torch",
    "from_hf",
    "hf_config",
    "import_hf",
    "import_torchtitan",
    "model_config_from_hf",
    "parse_size",
    "to_hf",
]
