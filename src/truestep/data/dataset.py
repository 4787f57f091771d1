"""`TokenDataset`: a prepared data directory viewed as fixed-length training windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from truestep.data.errors import DataError
from truestep.data.meta import open_mask, open_shard, verify_data_dir


class TokenDataset:
    """All shards of `data_dir` concatenated into one token stream, cut into non-overlapping windows.

    Sample i is tokens[i*seq_len : i*seq_len + seq_len + 1]: seq_len+1 tokens so that inputs and
    targets (shifted by one) both have seq_len tokens. Consecutive samples share one boundary token,
    which is why a stream of N tokens yields (N - 1) // seq_len samples. Windows may span shards.

    Chat data (`has_mask`) has a loss mask beside the tokens, viewed the same way (`masks`); its
    conversations were packed into blocks of the data's own window length (data/packing.py), so
    seq_len must be a multiple of it, or windows would cut conversations.
    """

    def __init__(self, data_dir: Path, seq_len: int, verify_hashes: bool = False) -> None:
        if seq_len <= 0:
            raise DataError(f"seq_len must be positive, got {seq_len}")
        self.data_dir = Path(data_dir)
        self.seq_len = int(seq_len)
        # Hashing is opt-in: it reads every byte, which defeats memory-mapping on a large corpus.
        self.meta: dict[str, Any] = verify_data_dir(self.data_dir, check_hashes=verify_hashes)
        self._shards = [open_shard(self.data_dir, e, self.meta["dtype"]) for e in self.meta["shards"]]
        chat = self.meta.get("chat")
        self._masks = None if chat is None else [open_mask(self.data_dir, e) for e in self.meta["shards"]]
        if chat is not None and self.seq_len % chat["seq_len"]:
            raise DataError(
                f"{self.data_dir} holds conversations packed into windows of {chat['seq_len']} tokens "
                f"(prepare-data --chat --seq-len {chat['seq_len']}): data.seq_len {self.seq_len} would cut "
                "them; train with a multiple of it, or prepare the data again for this seq_len"
            )
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

    @property
    def has_mask(self) -> bool:
        """Whether the loss is masked (chat data): targets outside the assistant's turns are ignored."""
        return self._masks is not None

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Stream tokens [start, stop) as int64, copied out of the memory maps."""
        return self._span(self._shards, start, stop)

    def _span(self, arrays: list[np.ndarray], start: int, stop: int) -> np.ndarray:
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
            out[pos - start : end - start] = arrays[k][pos - shard_start : end - shard_start]
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

    def sample_mask(self, i: int) -> np.ndarray:
        """The loss mask of sample `i`'s seq_len+1 tokens (1: trained); all ones without a mask."""
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} outside [0, {self.num_samples})")
        if self._masks is None:
            return np.ones(self.seq_len + 1, dtype=np.int64)
        start = int(i) * self.seq_len
        return self._span(self._masks, start, start + self.seq_len + 1)

    def masks(self, indices: np.ndarray | list[int]) -> np.ndarray:
        """`sample_mask` of each index, stacked like `samples`."""
        out = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
        for row, i in enumerate(indices):
            out[row] = self.sample_mask(int(i))
        return out
