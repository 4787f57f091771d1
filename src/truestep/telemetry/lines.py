"""What a metrics.jsonl line says about the trajectory, and whether two lines of one step agree.

A metrics line holds bookkeeping (when it was written, by which attempt, how long the step took) and
observables the trajectory determines (loss, grad norm, learning rate, tokens seen, and whatever a
later version adds). The split is declared here, next to the writer, by listing the bookkeeping: every
other numeric field counts as determined, so a field added later is compared by default (failing
closed) instead of being silently ignored.

`line_differences` is the one comparison of two lines of the same step, bit for bit. The instrument
uses it for a step logged twice (the pre-fault line and the line recomputed after a restart:
analysis/fidelity.py), and a resume self-check inside training can use it too (this room is below
train).
"""

from __future__ import annotations

import math
import struct
from typing import Any

BOOKKEEPING_FIELDS = frozenset({"step", "time", "mono", "attempt", "step_time", "peak_mem_bytes"})
"""Fields of a metrics line that the trajectory does not determine (clocks, attempt number, the step
itself, which keys the line, the process's memory high-water mark). Everything else numeric is an
observable."""


def determined(line: dict[str, Any]) -> dict[str, float | int]:
    """The line's observables: its numeric fields that are not bookkeeping (bools are not numbers)."""
    return {
        k: v
        for k, v in line.items()
        if k not in BOOKKEEPING_FIELDS and isinstance(v, int | float) and not isinstance(v, bool)
    }


def same_bits(a: float | int, b: float | int) -> bool:
    """Exactly the same logged value: equal integers, or floats with the same float64 bit pattern (so
    -0.0 != 0.0, and a NaN equals only the same NaN)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if math.isnan(a) and math.isnan(b):
        return True
    return struct.pack(">d", float(a)) == struct.pack(">d", float(b))


def line_differences(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """The observables of two lines of one step that are not bit-identical, or present in one only,
    sorted by name. Empty: the two lines say the same thing about the trajectory."""
    a, b = determined(first), determined(second)
    return sorted(k for k in set(a) | set(b) if k not in a or k not in b or not same_bits(a[k], b[k]))
