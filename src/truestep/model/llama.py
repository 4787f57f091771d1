"""Llama-3-style dense decoder: pre-norm, no biases, RMSNorm, RoPE, GQA via SDPA, SwiGLU.

The module knows nothing about meshes or checkpoints. Tensor parallelism works on it unchanged because
attention reshapes heads as (B, S, -1, head_dim): under TP each rank sees only its local heads.
Given a `KVCache`, the forward decodes incrementally (generation); without one it is the training path.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from truestep.config.schema import ModelConfig
from truestep.model.init import INIT_SCHEMES, fill_blockwise, on_meta, param_std
from truestep.model.kv_cache import KVCache, LayerKV
from truestep.model.rope import apply_rope, head_dim, rope_tables_for


def ffn_hidden_dim(cfg: ModelConfig) -> int:
    """The Llama hidden-size rule: 2/3 of 4*dim, times an optional multiplier, rounded up."""
    hidden = int(2 * (4 * cfg.dim) / 3)
    if cfg.ffn_dim_multiplier:
        hidden = int(cfg.ffn_dim_multiplier * hidden)
    return cfg.multiple_of * ((hidden + cfg.multiple_of - 1) // cfg.multiple_of)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32 whatever the parameter dtype (bf16 on CUDA) for stability.
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = head_dim(cfg)
        n_kv = cfg.n_kv_heads or cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, n_kv * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, n_kv * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerKV | None = None
    ) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.wq(x).view(bsz, seq, -1, self.head_dim)
        k = self.wk(x).view(bsz, seq, -1, self.head_dim)
        v = self.wv(x).view(bsz, seq, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        mask = None
        if cache is not None:
            k, v = cache.append(k, v)
            if cache.start > 0 and seq > 1:  # new queries see the cached prefix and each other causally
                queries = torch.arange(cache.start, cache.start + seq, device=x.device)
                mask = queries[:, None] >= torch.arange(k.shape[1], device=x.device)[None, :]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            # One new query attends to every cached position; a fresh square block is plain causal.
            is_causal=mask is None and q.shape[1] == k.shape[1] and seq > 1,
            enable_gqa=q.shape[2] != k.shape[2],
        )
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = ffn_hidden_dim(cfg)
        self.w1 = nn.Linear(cfg.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)
        self.dropout = cfg.dropout
        self.recompute = False
        """Activation checkpointing (model/recompute.py): keep only this block's input for the backward
        and run its forward again there, instead of keeping every intermediate."""

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerKV | None = None
    ) -> torch.Tensor:
        if self.recompute and cache is None and torch.is_grad_enabled():
            # Non-reentrant: works under FSDP2 (the recompute runs inside the block's own backward, while
            # its parameters are gathered) and replays the RNG state, so dropout masks are the same.
            return checkpoint(self._forward, x, cos, sin, use_reentrant=False, preserve_rng_state=True)
        return self._forward(x, cos, sin, cache)

    def _forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerKV | None = None
    ) -> torch.Tensor:
        h = self.attention(self.attention_norm(x), cos, sin, cache)
        x = x + F.dropout(h, self.dropout, self.training)
        h = self.feed_forward(self.ffn_norm(x))
        return x + F.dropout(h, self.dropout, self.training)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        # ModuleDict keyed by index keeps FQNs stable across parallel wrappings. The parameter names match
        # torchtitan's llama3, but its RoPE pairs dimensions differently: see interop/torchtitan.py.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        if torch.empty(0).is_meta:  # built on the meta device: the tables are computed once allocated
            cos, sin = (torch.empty(cfg.max_seq_len, head_dim(cfg)) for _ in range(2))  # (init_buffers)
        else:
            cos, sin = rope_tables_for(cfg)
        # Non-persistent: derived from the config, never checkpointed.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def initial_values(self, seed: int) -> Iterator[tuple[nn.Parameter, torch.Tensor]]:
        """The "full" scheme (model/init.py): each parameter with its full initial value (fp32, CPU), one
        at a time, drawn in order from one generator seeded with `seed`.

        The values depend on the parameter's global shape and order only, so a sharded model (DTensor
        parameters, built on the meta device) gets exactly the weights an unsharded one does, and no
        more than one full parameter is ever held: parallel/parallelize.py writes each into its shards.
        """
        gen = torch.Generator(device="cpu").manual_seed(seed)
        for name, param in self.named_parameters():
            std = param_std(name, self.cfg)
            if std is None:
                yield param, torch.ones(param.shape, dtype=torch.float32)
                continue
            yield param, torch.randn(param.shape, generator=gen, dtype=torch.float32).mul_(std)

    @torch.no_grad()
    def init_buffers(self) -> None:
        """The RoPE tables, derived from the config (uninitialized after `to_empty`)."""
        cos, sin = rope_tables_for(self.cfg)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    @torch.no_grad()
    def init_weights(self, seed: int, scheme: str = "blockwise") -> None:
        """Deterministic init from `seed` alone of an unsharded model (generation, tests); a sharded one
        is initialized by parallel.parallelize.init_parameters with the same values. `scheme`: "blockwise"
        or "full" (model/init.py)."""
        if scheme == "full":
            for param, values in self.initial_values(seed):
                param.copy_(values)
        elif scheme == "blockwise":
            for name, param in self.named_parameters():
                fill_blockwise(param, seed, name, param.shape, param_std(name, self.cfg), [0] * param.dim())
        else:
            raise ValueError(f"unknown init scheme {scheme!r}; expected one of {', '.join(INIT_SCHEMES)}")
        self.init_buffers()

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits (B, S, vocab) in fp32. With `cache`, `tokens` continue the cached positions and their
        keys/values are appended to it."""
        start = cache.length if cache is not None else 0
        end = start + tokens.shape[1]
        if end > self.cfg.max_seq_len:
            raise ValueError(f"position {end - 1} is beyond model.max_seq_len={self.cfg.max_seq_len}")
        if cache is not None:
            cache.check_room(tokens.shape[1])
        cos, sin = self.rope_cos[start:end], self.rope_sin[start:end]
        h = self.tok_embeddings(tokens)
        for index, layer in enumerate(self.layers.values()):
            h = layer(h, cos, sin, cache.layer(index) if cache is not None else None)
        if cache is not None:
            cache.advance(tokens.shape[1])
        return self.output(self.norm(h)).float()


def count_parameters(cfg: ModelConfig) -> int:
    """Parameter count on the meta device: nothing is allocated, so 70B presets are cheap."""
    with on_meta():
        model = Transformer(cfg)
    return sum(p.numel() for p in model.parameters())
