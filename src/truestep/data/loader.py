"""`BatchLoader`: this rank's micro-batches of each global batch, as torch tensors."""

from __future__ import annotations

from typing import Any

import torch

from truestep.data.dataset import TokenDataset
from truestep.data.errors import DataError
from truestep.data.sampler import GlobalSampler

MicroBatch = tuple[torch.Tensor, torch.Tensor]


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
        tokens = self.dataset.samples(indices)
        out: list[MicroBatch] = []
        mb = self.micro_batch_size
        for m in range(self.num_micro_batches):
            rows = tokens[m * mb : (m + 1) * mb]
            # Explicit copies: contiguous tensors that do not alias each other (they overlap by
            # all but one token), so an in-place op on the inputs cannot change the targets.
            inputs = torch.from_numpy(rows[:, :-1].copy())
            targets = torch.from_numpy(rows[:, 1:].copy())
            out.append((inputs, targets))
        return out

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
