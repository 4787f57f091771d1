"""`TokenDataset`: a prepared data directory viewed as fixed-length training windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from truestep.data.errors import DataError
from truestep.data.meta import open_shard, verify_data_dir


class TokenDataset:
    """All shards of `data_dir` concatenated into one token stream, cut into non-overlapping windows.

    Sample i is tokens[i*seq_len : i*seq_len + seq_len + 1]: seq_len+1 tokens so that inputs and
    targets (shifted by one) both have seq_len tokens. Consecutive samples share one boundary token,
    which is why a stream of N tokens yields (N - 1) // seq_len samples. Windows may span shards.
    """

    def __init__(self, data_dir: Path, seq_len: int, verify_hashes: bool = False) -> None:
        if seq_len <= 0:
            raise DataError(f"seq_len must be positive, got {seq_len}")
        self.data_dir = Path(data_dir)
        self.seq_len = int(seq_len)
        # Hashing is opt-in: it reads every byte, which defeats memory-mapping on a large corpus.
        self.meta: dict[str, Any] = verify_data_dir(self.data_dir, check_hashes=verify_hashes)
        self._shards = [open_shard(self.data_dir, e, self.meta["dtype"]) for e in self.meta["shards"]]
        lengths = np.array([s.shape[0] for s in self._shards], dtype=np.int64)
        # _starts[k] is the stream offset of shard k; the extra last entry is the total length.
        self._starts = np.concatenate([[0], np.cumsum(lengths)])
        self.num_tokens = int(self._starts[-1])
        self.num_samples = (self.num_tokens - 1) // self.seq_len
        if self.num_samples <= 0:
            raise DataError(
                f"corpus has {self.num_tokens} tokens, too few for seq_len {self.seq_len} "
                f"(need at least {self.seq_len + 1})"
            )

    @property
    def vocab_size(self) -> int:
        """Vocabulary size recorded by the tokenizer that prepared the data."""
        return int(self.meta["vocab_size"])

    @property
    def eos_id(self) -> int:
        """End-of-document token id."""
        return int(self.meta["eos_id"])

    def __len__(self) -> int:
        return self.num_samples

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Stream tokens [start, stop) as int64, copied out of the memory maps."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"token range [{start}, {stop}) outside [0, {self.num_tokens})")
        out = np.empty(stop - start, dtype=np.int64)
        # First shard containing `start`; side="right" skips shards that end exactly at `start`.
        k = int(np.searchsorted(self._starts, start, side="right")) - 1
        pos = start
        while pos < stop:
            shard_start = int(self._starts[k])
            shard_stop = int(self._starts[k + 1])
            end = min(stop, shard_stop)
            out[pos - start : end - start] = self._shards[k][pos - shard_start : end - shard_start]
            pos = end
            k += 1
        return out

    def sample(self, i: int) -> np.ndarray:
        """The seq_len+1 tokens of sample `i`, as int64."""
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} outside [0, {self.num_samples})")
        start = int(i) * self.seq_len
        return self.tokens(start, start + self.seq_len + 1)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.sample(i)

    def samples(self, indices: np.ndarray | list[int]) -> np.ndarray:
        """Stack samples into an int64 array of shape [len(indices), seq_len + 1]."""
        out = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
        for row, i in enumerate(indices):
            out[row] = self.sample(int(i))
        return out
