"""How the report writes numbers, and the fixed orders and labels of its badput buckets and recovery phases.

Every number in report.md, report.html and the CLI text goes through one of the fmt_* functions here, so
the three always read the same.
"""

from __future__ import annotations

import math
from typing import Any

from truestep.analysis.goodput import BUCKETS
from truestep.analysis.idle import IDLE_KINDS
from truestep.analysis.mttr import PHASES, Incident
from truestep.analysis.restores import StepsLost

__all__ = ["BADPUT_ORDER", "PHASES", "PHASE_LABELS", "finite", "fmt_dev", "fmt_pct", "fmt_rate"]
__all__ += ["fmt_restore", "fmt_seconds", "fmt_step", "fmt_steps_lost", "plural"]

BADPUT_ORDER = (*BUCKETS, *IDLE_KINDS, "other")
"""The badput table's rows: the analysis's buckets, then the remainder."""
PHASE_LABELS = {
    "detect": "detect",
    "teardown": "teardown",
    "relaunch": "relaunch",
    "restore": "start+restore",
    "first_step": "first step",
}


def finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def fmt_seconds(x: float | None) -> str:
    """2-3 significant decimals: 0.0153 -> '15.3 ms', 0.153 -> '0.153 s', 1.534 -> '1.53 s', 153.4 -> '153.4 s'."""
    if x is None:
        return "—"
    if not finite(x):
        return "∞"
    a = abs(x)
    if a == 0:
        return "0 s"
    if a >= 99.95:
        return f"{x:,.1f} s"
    if a >= 0.9995:
        return f"{x:.2f} s"
    if a >= 0.09995:
        return f"{x:.3f} s"
    return f"{x * 1e3:.3g} ms"


def fmt_rate(x: float | None) -> str:
    """Tokens per second with thousands separators."""
    if x is None:
        return "—"
    if not finite(x):
        return "∞"
    return f"{x:,.0f} tok/s" if abs(x) >= 100 else f"{x:,.2f} tok/s"


def fmt_dev(x: float | None) -> str:
    """A deviation: exact zero stays '0' (that is the bitwise case), otherwise 3 significant digits."""
    if x is None:
        return "—"
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if not finite(x):
        return "∞"
    return "0" if x == 0 else f"{x:.3g}"


def fmt_pct(x: float | None) -> str:
    if x is None or not finite(x):
        return "—"
    return f"{100 * x:.1f} %"


def fmt_step(x: int | None) -> str:
    return "—" if x is None else str(x)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def fmt_steps_lost(lost: StepsLost) -> str:
    """'1, 6 (mean 3.5; 1 from memory, 1 from disk)'; '—' without a recovery."""
    if not lost.sources:
        return "— (no recovery)"
    each = ", ".join("?" if n is None else str(n) for n in lost.per_recovery)
    where = "; ".join(f"{n} from {source}" for source, n in lost.by_source().items())
    mean = f"mean {lost.mean:.3g}; " if lost.mean is not None and len(lost.per_recovery) > 1 else ""
    return f"{each} ({mean}{where})"


def fmt_restore(incident: Incident) -> str:
    """The restore within an incident's `restore` phase: '0.21 s from memory', '— (fresh start)'."""
    if incident.restore_source is None:
        return "— (fresh start)" if incident.phases_s.get("first_step") is not None else "—"
    return f"{fmt_seconds(incident.restore_s)} from {incident.restore_source}"
