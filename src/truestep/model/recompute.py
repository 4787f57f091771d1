"""Activation checkpointing (`train.activation_checkpointing`): which transformer blocks keep only their
input for the backward and recompute the rest there.

- `none`: every block keeps its intermediates (fastest, most memory).
- `full`: every block recomputes: a block keeps only its input (batch x seq x dim), and during the
  backward one block's intermediates exist at a time. Costs about one extra forward per step.
- `selective`: every other block recomputes (blocks 0, 2, 4, ...; the whole block, not single ops):
  about half the activation memory of `none` for about half the extra forward of `full`.

The embedding, the final norm and the output projection (with the logits, often the largest single
activation) are never recomputed. Recomputation replays the same operations on the same inputs with
the RNG state restored, so on a deterministic platform the trajectory is bitwise the same in every
mode (tests/test_memory.py checks it): the mode is not part of the trajectory fingerprint.
"""

from __future__ import annotations

from torch import nn

from truestep.config.schema import ACTIVATION_CHECKPOINTING as MODES


def recomputed_blocks(mode: str, n_layers: int) -> list[int]:
    """Indices of the blocks that recompute under `mode`."""
    if mode == "none":
        return []
    if mode == "full":
        return list(range(n_layers))
    if mode == "selective":
        return list(range(0, n_layers, 2))
    raise ValueError(f"unknown activation checkpointing mode {mode!r}; one of {', '.join(MODES)}")


def set_activation_checkpointing(model: nn.Module, mode: str) -> list[int]:
    """Mark the blocks of a (possibly FSDP/TP-wrapped) Transformer that recompute; returns their indices."""
    layers = model.get_submodule("layers")
    chosen = set(recomputed_blocks(mode, len(layers)))
    for index, block in enumerate(layers.values()):
        block.recompute = index in chosen
    return sorted(chosen)
