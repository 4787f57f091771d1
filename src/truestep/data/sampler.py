"""`GlobalSampler`: the global sample order as a pure function of (data_seed, global batch index).

Think of an infinite stream of sample positions p = 0, 1, 2, ... Position p lies in epoch
e = p // num_samples and maps to perm_e[p % num_samples], where perm_e is a permutation seeded by
(data_seed, e) alone. Global batch b is positions [b*G, (b+1)*G). Nothing depends on how many
batches were drawn before, so resuming at batch b is O(1), and nothing depends on the data-parallel
size, so a job restarted with a different dp sees the same global batches (only split differently).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from truestep.data.errors import DataError

STATE_KEYS = ("next_batch", "data_seed", "global_batch_size", "num_samples")


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


class GlobalSampler:
    """Maps global batch indices to sample indices; also carries a `next_batch` cursor."""

    def __init__(self, num_samples: int, global_batch_size: int, data_seed: int, stream: int = 0) -> None:
        """`stream` > 0 gives an independent order over the same seed (source `stream` of a mixture);
        stream 0 is the single-corpus order, so a mixture's first source is drawn in exactly that order."""
        for name, value, minimum in (
            ("num_samples", num_samples, 1),
            ("global_batch_size", global_batch_size, 1),
            # SeedSequence only takes non-negative entropy.
            ("data_seed", data_seed, 0),
        ):
            if not _is_int(value) or value < minimum:
                raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")
        self.num_samples = int(num_samples)
        self.global_batch_size = int(global_batch_size)
        self.data_seed = int(data_seed)
        self.stream = int(stream)
        self.next_batch = 0
        # Only the most recent epoch's permutation is kept: batches are consumed in order, so a
        # permutation is computed once per epoch, which is the whole per-epoch cost.
        self._perm_epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        """The sample order of `epoch` (cached for the latest epoch asked for)."""
        if epoch != self._perm_epoch:
            entropy = [self.data_seed, int(epoch)] + ([self.stream] if self.stream else [])
            rng = np.random.default_rng(entropy)
            self._perm = rng.permutation(self.num_samples).astype(np.int64, copy=False)
            self._perm_epoch = epoch
        return self._perm

    def positions(self, start: int, count: int) -> np.ndarray:
        """Sample indices at stream positions [start, start + count)."""
        if start < 0 or count < 0:
            raise DataError(f"invalid position range start={start} count={count}")
        out = np.empty(count, dtype=np.int64)
        filled = 0
        while filled < count:
            epoch, offset = divmod(start + filled, self.num_samples)
            take = min(self.num_samples - offset, count - filled)
            out[filled : filled + take] = self.permutation(epoch)[offset : offset + take]
            filled += take
        return out

    def batch_indices(self, b: int) -> np.ndarray:
        """All G sample indices of global batch `b`."""
        if not _is_int(b) or b < 0:
            raise DataError(f"batch index must be a non-negative integer, got {b!r}")
        return self.positions(int(b) * self.global_batch_size, self.global_batch_size)

    def per_rank(self, dp_size: int) -> int:
        """Samples per data-parallel rank; G must divide evenly so every rank does equal work."""
        if not _is_int(dp_size) or dp_size <= 0:
            raise DataError(f"dp_size must be a positive integer, got {dp_size!r}")
        if self.global_batch_size % dp_size:
            raise DataError(
                f"global_batch_size {self.global_batch_size} is not divisible by dp_size {dp_size}"
            )
        return self.global_batch_size // dp_size

    def rank_indices(self, b: int, dp_rank: int, dp_size: int) -> np.ndarray:
        """Rank `dp_rank`'s contiguous slice (G / dp_size samples) of global batch `b`."""
        k = self.per_rank(dp_size)
        if not _is_int(dp_rank) or not 0 <= dp_rank < dp_size:
            raise DataError(f"dp_rank {dp_rank!r} outside [0, {dp_size})")
        if not _is_int(b) or b < 0:
            raise DataError(f"batch index must be a non-negative integer, got {b!r}")
        return self.positions(int(b) * self.global_batch_size + int(dp_rank) * k, k)

    def next(self) -> np.ndarray:
        """Indices of global batch `next_batch`, then advance the cursor."""
        out = self.batch_indices(self.next_batch)
        self.next_batch += 1
        return out

    # -- checkpoint state -------------------------------------------------------------------------

    def make_state(self, next_batch: int) -> dict[str, int]:
        """The JSON-able state for a cursor at `next_batch` (what a checkpoint stores)."""
        return {
            "next_batch": int(next_batch),
            "data_seed": self.data_seed,
            "global_batch_size": self.global_batch_size,
            "num_samples": self.num_samples,
        }

    def validate_state(self, state: dict[str, Any]) -> int:
        """Check a saved state against this sampler and return its `next_batch`.

        A mismatch would silently replay a different sample order, so it is an error, not a warning.
        """
        if not isinstance(state, dict):
            raise DataError(f"data loader state must be a dict, got {type(state).__name__}")
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise DataError(f"data loader state is missing {', '.join(missing)}")
        for key in STATE_KEYS:
            if not _is_int(state[key]):
                raise DataError(f"data loader state: {key} must be an integer, got {state[key]!r}")
        for key in ("data_seed", "global_batch_size", "num_samples"):
            if int(state[key]) != getattr(self, key):
                raise DataError(
                    f"data loader state mismatch: checkpoint has {key}={state[key]}, "
                    f"but the current run has {key}={getattr(self, key)}"
                )
        if state["next_batch"] < 0:
            raise DataError(f"data loader state: next_batch must be >= 0, got {state['next_batch']}")
        return int(state["next_batch"])

    def state_dict(self) -> dict[str, int]:
        """State of this sampler's own cursor."""
        return self.make_state(self.next_batch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Seek to a saved cursor in O(1): no batches are replayed."""
        self.next_batch = self.validate_state(state)
