"""What every benchmark here shares: a counterbalanced order, min/median/max, and the machine's load.

Side-by-side comparisons only mean something when machine noise and warm-up drift hit every side
alike: `abba` interleaves the sides so that each one runs equally often early and late in a round, and
`spread` never reports a median without the range it came from. `load` is printed next to every
result, because on a shared machine the numbers depend on it.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence


def abba(sides: Sequence[str], rounds: int) -> list[str]:
    """`rounds` rounds of every side, each round reversed from the previous one and the starting side
    rotated every two rounds: A B, B A, B A, A B, ... (for two sides: ABBA ABBA ...)."""
    order: list[str] = []
    for r in range(rounds):
        rotated = list(sides[(r // 2) % len(sides) :]) + list(sides[: (r // 2) % len(sides)])
        order += rotated[::-1] if r % 2 else rotated
    return order


def spread(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """'median [min-max]' (or '-' when there is nothing to report)."""
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def load() -> str:
    """The load averages (1, 5, 15 min) and the CPU count, for the line next to a result."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def clopper_pearson(hits: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval for a binomial proportion hits/n: conservative,
    so a claimed rate is never flattered by a normal approximation at small counts. (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    alpha = (1 - confidence) / 2

    def solve(target: float, k: int) -> float:
        # The p at which P(X <= k) = target; P(X <= k) falls as p grows.
        lo, hi = 0.0, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            if _binom_cdf(k, n, mid) > target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if hits == 0 else solve(1 - alpha, hits - 1)
    upper = 1.0 if hits == n else solve(alpha, hits)
    return lower, upper
