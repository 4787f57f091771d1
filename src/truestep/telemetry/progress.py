"""Console progress (rank 0): a tqdm bar with loss and throughput."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, start: int, enabled: bool, every: int) -> None:
        self.every = max(1, every)
        self.bar = tqdm(total=total, initial=start, disable=not enabled, file=sys.stderr, dynamic_ncols=True)

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        # The postfix first: `update` draws it, so the bar shows this step's loss, not the previous one's.
        if step % self.every == 0:
            self.bar.set_postfix_str(f"loss={loss:.4f} tok/s={tokens_per_s:,.0f}", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
