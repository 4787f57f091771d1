"""Parameter names: truestep FQNs <-> Hugging Face Llama names.

truestep's RoPE already uses the HF "rotate_half" layout (the two halves of each head, not interleaved
pairs), so the q/k projections map over as they are: no permutation of rows is needed.
"""

from __future__ import annotations

import re

from truestep.interop.errors import InteropError

_TOP_TO_HF = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TO_HF = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_FROM_HF = {hf: ts for ts, hf in _TOP_TO_HF.items()}
_LAYER_FROM_HF = {hf: ts for ts, hf in _LAYER_TO_HF.items()}
# Order of the per-layer tensors in exported files (the order transformers itself writes them in).
_LAYER_ORDER = list(_LAYER_TO_HF)

_TS_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def to_hf(fqn: str) -> str:
    """The HF name of a truestep parameter FQN (e.g. layers.0.attention.wq.weight)."""
    if fqn in _TOP_TO_HF:
        return _TOP_TO_HF[fqn]
    match = _TS_LAYER.match(fqn)
    if match and match.group(2) in _LAYER_TO_HF:
        return f"model.layers.{match.group(1)}.{_LAYER_TO_HF[match.group(2)]}"
    raise InteropError(f"no Hugging Face name for truestep parameter {fqn!r}")


def from_hf(name: str) -> str | None:
    """The truestep FQN of an HF Llama tensor name, or None if truestep has no such parameter."""
    if name in _TOP_FROM_HF:
        return _TOP_FROM_HF[name]
    match = _HF_LAYER.match(name)
    if match and match.group(2) in _LAYER_FROM_HF:
        return f"layers.{match.group(1)}.{_LAYER_FROM_HF[match.group(2)]}"
    return None


def sort_key(fqn: str) -> tuple[int, int, int]:
    """Embedding, then layers in numeric order (fixed order within a layer), final norm, output."""
    if fqn == "tok_embeddings.weight":
        return (0, 0, 0)
    match = _TS_LAYER.match(fqn)
    if match:
        rest = match.group(2)
        within = _LAYER_ORDER.index(rest) if rest in _LAYER_ORDER else len(_LAYER_ORDER)
        return (1, int(match.group(1)), within)
    return (2, 0 if fqn == "norm.weight" else 1, 0)
