"""The key/value cache of incremental decoding: each layer's rotated keys and values for the positions
seen so far, preallocated for the whole generation so a step writes in place and allocates nothing.

Training never uses it: `Transformer.forward(tokens)` without a cache is the training path, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from truestep.config.schema import ModelConfig
from truestep.model.rope import head_dim


@dataclass
class LayerKV:
    """One layer's view of the cache for the current forward: new positions start at `start`."""

    keys: torch.Tensor
    values: torch.Tensor
    start: int

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (B, S, H_kv, D) keys/values at [start, start+S); return all of [0, start+S)."""
        end = self.start + k.shape[1]
        self.keys[:, self.start : end] = k
        self.values[:, self.start : end] = v
        return self.keys[:, :end], self.values[:, :end]


class KVCache:
    """Keys and values of every layer, for positions [0, length), with room for `max_len` positions."""

    def __init__(
        self, cfg: ModelConfig, batch: int, max_len: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        if max_len > cfg.max_seq_len:
            raise ValueError(
                f"a cache of {max_len} positions exceeds model.max_seq_len={cfg.max_seq_len} "
                "(the RoPE tables end there)"
            )
        shape = (batch, max_len, cfg.n_kv_heads or cfg.n_heads, head_dim(cfg))
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.max_len = max_len
        self.length = 0
        """Positions already stored: the next forward's tokens sit at positions length, length+1, ..."""

    def layer(self, index: int) -> LayerKV:
        return LayerKV(self.keys[index], self.values[index], self.length)

    def check_room(self, count: int) -> None:
        if self.length + count > self.max_len:
            raise ValueError(f"KV cache full: {self.length} + {count} positions > {self.max_len}")

    def advance(self, count: int) -> None:
        """Mark `count` more positions as stored (after every layer has appended them)."""
        self.length += count
