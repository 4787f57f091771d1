"""Packing conversations into the windows training will cut, so that no window cuts a conversation.

Training views a data directory as windows: sample i is stream tokens [i*S, i*S + S] (S = data.seq_len),
its inputs the first S, its targets the last S. So the stream is laid out in blocks of S tokens, and a
conversation (never longer than S) is placed whole inside one block:

- `pack` (the default): conversations go into the current block in input order while they fit; when the
  next one does not, the rest of the block is padding and it starts the next block (greedy, in order:
  no reordering, so the layout is a function of the conversation lengths alone);
- `pad`: every conversation starts a block of its own (no conversation attends to another's tokens).

Padding is the tokenizer's pad id (else EOS), never trained. After the last block one more padding token
ends the stream, so the last block is a whole window too. A window of a multiple of S (training with a
longer data.seq_len) still holds whole blocks. The packer runs in the main process on the results in
input order, so the layout is the same for any number of workers; its state (how full the current block
is) is saved in the resume journal with the counters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Packer:
    seq_len: int
    packing: str
    pad_id: int
    fill: int = 0
    """Tokens in the current block."""

    def _padding(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        return np.full(count, self.pad_id, dtype=np.int64), np.zeros(count, dtype=np.uint8)

    def pack(self, tokens: np.ndarray, mask: np.ndarray, lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The stream of conversations `tokens` (each of `lengths`, at most seq_len) with their padding."""
        out_tokens: list[np.ndarray] = []
        out_mask: list[np.ndarray] = []
        pos = 0
        for length in lengths:
            if self.fill and (self.packing == "pad" or self.fill + length > self.seq_len):
                pad_tokens, pad_mask = self._padding(self.seq_len - self.fill)
                out_tokens.append(pad_tokens)
                out_mask.append(pad_mask)
                self.fill = 0
            out_tokens.append(tokens[pos : pos + length])
            out_mask.append(mask[pos : pos + length])
            pos += length
            self.fill = (self.fill + length) % self.seq_len
        if not out_tokens:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint8)
        return np.concatenate(out_tokens), np.concatenate(out_mask)

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """The padding that ends the last block, and the one token after it."""
        return self._padding((self.seq_len - self.fill) % self.seq_len + 1)
