"""Rotary position embeddings in the Hugging Face half-split ("rotate_half") layout, with Llama 3.1/3.2
frequency scaling or linear position interpolation.

Each head's dimensions are split into two halves, and dimension j is rotated together with j + head_dim/2
by the j-th frequency. Meta's original Llama code and torchtitan rotate *interleaved* pairs (2j, 2j+1)
instead: same frequencies, different pairing, so q/k weights move between the two layouts only with a
row permutation (see `interop/torchtitan.py`).

Tables are computed in float64 and rounded once to float32, so they do not depend on the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from truestep.config.schema import ModelConfig


@dataclass(frozen=True)
class Llama3Scaling:
    """Llama 3.1/3.2 RoPE scaling: long wavelengths are stretched by `factor`, short ones kept, and the
    band between blended smoothly (`rope_type: llama3` in a Hugging Face config)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_seq_len: int

    def apply(self, inv_freq: torch.Tensor) -> torch.Tensor:
        """Scaled inverse frequencies (same shape and dtype as `inv_freq`)."""
        wavelen = 2 * math.pi / inv_freq
        low_freq_wavelen = self.original_max_seq_len / self.low_freq_factor
        high_freq_wavelen = self.original_max_seq_len / self.high_freq_factor
        # 0 where the wavelength is long (fully scaled), 1 where it is short (unchanged), linear between.
        smooth = (self.original_max_seq_len / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        blended = (1 - smooth) * inv_freq / self.factor + smooth * inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / self.factor, inv_freq)
        medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(medium, blended, scaled)


@dataclass(frozen=True)
class LinearScaling:
    """Position interpolation: every frequency divided by `factor` (`rope_type: linear`)."""

    factor: float

    def apply(self, inv_freq: torch.Tensor) -> torch.Tensor:
        return inv_freq / self.factor


Scaling = Llama3Scaling | LinearScaling


def head_dim(cfg: ModelConfig) -> int:
    """Width of one attention head: `model.head_dim`, or dim / n_heads when that is 0."""
    return cfg.head_dim or cfg.dim // cfg.n_heads


def rope_scaling(cfg: ModelConfig) -> Scaling | None:
    """The frequency scaling `cfg` asks for (None: plain RoPE)."""
    if cfg.rope_scaling == "none":
        return None
    if cfg.rope_scaling == "linear":
        return LinearScaling(cfg.rope_scaling_factor)
    if cfg.rope_scaling != "llama3":
        raise ValueError(f"unknown model.rope_scaling {cfg.rope_scaling!r}")
    return Llama3Scaling(
        cfg.rope_scaling_factor,
        cfg.rope_low_freq_factor,
        cfg.rope_high_freq_factor,
        cfg.rope_original_max_seq_len,
    )


def inv_frequencies(dim: int, theta: float, scaling: Scaling | None = None) -> torch.Tensor:
    """The dim/2 rotation frequencies (float64), scaled when `scaling` is given."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    return scaling.apply(inv_freq) if scaling is not None else inv_freq


def rope_tables(
    head_dim: int, max_seq_len: int, theta: float, scaling: Scaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (max_seq_len, head_dim) in the HF half-split layout."""
    inv_freq = inv_frequencies(head_dim, theta, scaling)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rope_tables_for(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables a Transformer(cfg) uses: head width, length, base and scaling from the config."""
    return rope_tables(head_dim(cfg), cfg.max_seq_len, cfg.rope_theta, rope_scaling(cfg))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, S, H, D) by the tables (S, D): x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return (x.float() * cos + rotated.float() * sin).type_as(x)
