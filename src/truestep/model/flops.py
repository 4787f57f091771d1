"""Training FLOPs per token of the decoder, for model FLOPs utilization (MFU).

The PaLM appendix B count: 6 FLOPs per parameter per token for the forward and backward matmuls (the
embedding table excluded: it is a lookup; the output projection included), plus the attention scores
and weighted sum, 12 x layers x heads x head_dim x seq_len per token. Recomputation by activation
checkpointing is not counted: MFU measures useful work, so recomputing lowers it.
"""

from __future__ import annotations

from truestep.config.schema import ModelConfig
from truestep.model.llama import count_parameters
from truestep.model.rope import head_dim


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    matmul_params = count_parameters(cfg) - cfg.vocab_size * cfg.dim * (0 if cfg.tie_embeddings else 1)
    attention = 12 * cfg.n_layers * cfg.n_heads * head_dim(cfg) * seq_len
    return 6.0 * matmul_params + attention
