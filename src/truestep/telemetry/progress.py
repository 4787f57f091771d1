"""Console progress (rank 0): a tqdm bar on a terminal, plain step lines everywhere else.

A bar written into a file (a SLURM log, `2> log`) is a long line of carriage returns with the event
narration glued into it, and a job without a bar said nothing at all. So the bar is drawn only when the
stream is a terminal; otherwise (or with metrics.progress=false) one plain line every `every` steps says
the step, loss, learning rate, grad norm, tokens/s, peak memory and, where the device's peak is known,
MFU. Narration (telemetry/narrate.py) goes through `tqdm.write`, which moves a drawn bar below it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from tqdm import tqdm


@dataclass(frozen=True)
class StepStats:
    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float
    peak_mem_bytes: int
    mfu: float | None = None


def step_line(stats: StepStats, total: int) -> str:
    """One plain line for a step."""
    mfu = f" | mfu {100 * stats.mfu:.1f}%" if stats.mfu is not None else ""
    return (
        f"step {stats.step}/{total} | loss {stats.loss:.4f} | lr {stats.lr:.3g} | grad norm "
        f"{stats.grad_norm:.3f} | {stats.tokens_per_s:,.0f} tok/s | peak mem {stats.peak_mem_bytes / 2**30:.2f} GiB"
        f"{mfu}"
    )


class Progress:
    def __init__(
        self,
        total: int,
        start: int,
        enabled: bool,
        every: int,
        *,
        bar: bool = True,
        lines: bool = True,
        out: TextIO | None = None,
        prefix: str = "truestep train",
    ) -> None:
        """`enabled`: this rank speaks (rank 0); `bar`: metrics.progress; `lines`: metrics.step_lines."""
        self.every = max(1, every)
        self.total = total
        self.out = out or sys.stderr
        self.prefix = prefix
        terminal = bool(getattr(self.out, "isatty", lambda: False)())
        self.drawing = enabled and bar and terminal
        self.lines = enabled and lines and not self.drawing
        self.bar = tqdm(
            total=total, initial=start, disable=not self.drawing, file=self.out, dynamic_ncols=True
        )

    def update(self, stats: StepStats) -> None:
        if stats.step % self.every == 0 or stats.step == self.total:
            if self.drawing:
                # The postfix first: `update` draws it, so the bar shows this step's loss, not the previous one's.
                self.bar.set_postfix_str(
                    f"loss={stats.loss:.4f} tok/s={stats.tokens_per_s:,.0f}", refresh=False
                )
            elif self.lines:
                print(f"{self.prefix}: {step_line(stats, self.total)}", file=self.out, flush=True)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
