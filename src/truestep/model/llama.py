"""Llama-3-style dense decoder: pre-norm, no biases, RMSNorm, RoPE, GQA via SDPA, SwiGLU.

The module knows nothing about meshes or checkpoints. Tensor parallelism works on it unchanged because
attention reshapes heads as (B, S, -1, head_dim): under TP each rank sees only its local heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from truestep.config.schema import ModelConfig


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


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (max_seq_len, head_dim) in the HF half-split layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, S, H, D) by the tables (S, D): x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return (x.float() * cos + rotated.float() * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.dim // cfg.n_heads
        n_kv = cfg.n_kv_heads or cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, n_kv * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, n_kv * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.wq(x).view(bsz, seq, -1, self.head_dim)
        k = self.wk(x).view(bsz, seq, -1, self.head_dim)
        v = self.wv(x).view(bsz, seq, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.attention(self.attention_norm(x), cos, sin)
        x = x + F.dropout(h, self.dropout, self.training)
        h = self.feed_forward(self.ffn_norm(x))
        return x + F.dropout(h, self.dropout, self.training)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        # ModuleDict keyed by index (as torchtitan) keeps FQNs stable across parallel wrappings.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        # Non-persistent: derived from the config, never checkpointed.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Deterministic init from `seed` alone, on whatever device the parameters live.

        Call before sharding (or on a meta-built model after `to_empty`) so every layout starts from the
        same full weights.
        """
        gen = torch.Generator(device="cpu").manual_seed(seed)
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            is_out_proj = name.endswith("attention.wo.weight") or name.endswith("feed_forward.w2.weight")
            values = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            param.copy_(values.mul_(out_std if is_out_proj else std))
        cos, sin = rope_tables(self.cfg.dim // self.cfg.n_heads, self.cfg.max_seq_len, self.cfg.rope_theta)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        return self.output(self.norm(h)).float()


def count_parameters(cfg: ModelConfig) -> int:
    """Parameter count on the meta device: nothing is allocated, so 70B presets are cheap."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return sum(p.numel() for p in model.parameters())
