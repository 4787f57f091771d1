"""The figures' shared look: resolution, one color and legend label per timeline category, and saving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

DPI = 110
_SAVE_KW: dict[str, Any] = {"dpi": DPI, "metadata": {"Software": None}}

# One color per timeline category, shared with the report's badput table wording.
COLORS = {
    "useful": "#43a047",
    "lost_work": "#fb8c00",
    "after_violation": "#c62828",
    "unverifiable": "#bdbdbd",
    "startup": "#90a4ae",
    "restore": "#1e88e5",
    "checkpoint_blocking": "#8e24aa",
    "detection": "#fdd835",
    "teardown": "#6d4c41",
    "requeue_wait": "#d7ccc8",
    "not_running": "#eeeeee",
    "refused": "#ef9a9a",
}
LABELS = {
    "useful": "training (kept, correct)",
    "lost_work": "training later redone (lost work)",
    "after_violation": "training after the first violation",
    "unverifiable": "training past the reference's end (unverifiable)",
    "startup": "startup",
    "restore": "checkpoint restore",
    "checkpoint_blocking": "checkpoint save (blocking)",
    "detection": "detection (fault -> detected)",
    "teardown": "teardown",
    "requeue_wait": "relaunch / requeue wait",
    "not_running": "not running (between launches)",
    "refused": "refused attempt",
}


def save_figure(fig: Figure, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, **_SAVE_KW)
    return path
