"""`BatchLoader`: this rank's micro-batches of each global batch, as torch tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from truestep.data.dataset import TokenDataset
from truestep.data.errors import DataError
from truestep.data.sampler import GlobalSampler

MicroBatch = tuple[torch.Tensor, torch.Tensor]
IGNORE_INDEX = -100
"""A target the loss ignores (cross_entropy's default ignore_index): outside the assistant's turns."""


def split_micro_batches(
    tokens: np.ndarray, micro_batch_size: int, masks: np.ndarray | None = None
) -> list[MicroBatch]:
    """Rows [k, seq_len + 1] of one rank's samples as (inputs, targets) micro-batches of `micro_batch_size`.
    With `masks` (rows like `tokens`, 1: trained) a target whose mask is 0 is IGNORE_INDEX."""
    out: list[MicroBatch] = []
    for m in range(0, tokens.shape[0], micro_batch_size):
        rows = tokens[m : m + micro_batch_size]
        # Explicit copies: contiguous tensors that do not alias each other (they overlap by
        # all but one token), so an in-place op on the inputs cannot change the targets.
        inputs = torch.from_numpy(rows[:, :-1].copy())
        if masks is None:
            targets = torch.from_numpy(rows[:, 1:].copy())
        else:
            kept = masks[m : m + micro_batch_size, 1:] != 0
            targets = torch.from_numpy(np.where(kept, rows[:, 1:], IGNORE_INDEX))
        out.append((inputs, targets))
    return out


def check_batch_split(global_batch_size: int, dp_rank: int, dp_size: int, micro_batch_size: int) -> int:
    """Samples per rank of each global batch; every rank does equal work in whole micro-batches."""
    if dp_size <= 0 or global_batch_size % dp_size:
        raise DataError(f"global_batch_size {global_batch_size} is not divisible by dp_size {dp_size}")
    per_rank = global_batch_size // dp_size
    if not 0 <= dp_rank < dp_size:
        raise DataError(f"dp_rank {dp_rank} outside [0, {dp_size})")
    if micro_batch_size <= 0 or per_rank % micro_batch_size:
        raise DataError(
            f"micro_batch_size {micro_batch_size} must be positive and divide the per-rank batch "
            f"{per_rank} (global_batch_size {global_batch_size} / dp_size {dp_size})"
        )
    return per_rank


class BatchLoader:
    """Yields, per optimizer step, the micro-batches of rank `dp_rank`'s slice of the global batch.

    The rank slice (G / dp_size samples) is split into G / (dp_size * micro_batch_size)
    consecutive micro-batches. The only state is `next_batch`, the next global batch index.
    """

    def __init__(
        self,
        dataset: TokenDataset,
        sampler: GlobalSampler,
        dp_rank: int,
        dp_size: int,
        micro_batch_size: int,
    ) -> None:
        if sampler.num_samples != len(dataset):
            raise DataError(
                f"sampler was built for {sampler.num_samples} samples but the dataset has {len(dataset)}"
            )
        per_rank = sampler.per_rank(dp_size)
        if not 0 <= dp_rank < dp_size:
            raise DataError(f"dp_rank {dp_rank} outside [0, {dp_size})")
        if micro_batch_size <= 0 or per_rank % micro_batch_size:
            raise DataError(
                f"micro_batch_size {micro_batch_size} must be positive and divide the per-rank batch "
                f"{per_rank} (global_batch_size {sampler.global_batch_size} / dp_size {dp_size})"
            )
        self.dataset = dataset
        self.sampler = sampler
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.micro_batch_size = micro_batch_size
        self.num_micro_batches = per_rank // micro_batch_size
        self.next_batch = 0

    def batch_for(self, b: int) -> list[MicroBatch]:
        """Micro-batches (inputs, targets), each [micro_batch_size, seq_len] int64, of global batch b.

        Pure: it reads nothing but `b` and the constructor arguments, and moves no cursor.
        """
        indices = self.sampler.rank_indices(b, self.dp_rank, self.dp_size)
        masks = self.dataset.masks(indices) if self.loss_masked else None
        return split_micro_batches(self.dataset.samples(indices), self.micro_batch_size, masks)

    @property
    def loss_masked(self) -> bool:
        """Targets outside the trained tokens are IGNORE_INDEX (chat data): the loss is their mean."""
        return self.dataset.has_mask

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the tokenizer that prepared the data."""
        return self.dataset.vocab_size

    def tokens_per_source(self) -> dict[str, int] | None:
        """Tokens drawn from each source of a mixture; None for a single corpus."""
        return None

    def next(self) -> list[MicroBatch]:
        """Micro-batches of global batch `next_batch`, then advance to the following batch."""
        out = self.batch_for(self.next_batch)
        self.next_batch += 1
        return out

    def state_dict(self) -> dict[str, int]:
        """Small JSON-able state: the cursor plus what the sample order depends on."""
        return self.sampler.make_state(self.next_batch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the saved cursor in O(1); the sampler rejects a state from a different order."""
        self.next_batch = self.sampler.validate_state(state)
