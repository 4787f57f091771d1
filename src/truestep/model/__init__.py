"""The Llama-3-style decoder, its presets and init. Knows nothing of meshes or checkpoints."""

from truestep.model.llama import Transformer, count_parameters, ffn_hidden_dim

__all__ = ["Transformer", "count_parameters", "ffn_hidden_dim"]
