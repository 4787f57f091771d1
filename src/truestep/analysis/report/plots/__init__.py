"""The report's figures: one PNG per function, each returning the path it wrote.

Every figure draws analysis results (analysis/summary.py: comparisons, the floor model, verdicts, the
goodput spans) and, for the loss curves, the logged values themselves; none recomputes a measure. Figures
use matplotlib's Agg backend (no display needed) and no pyplot state: each function builds its own
Figure, so they are safe to call from a CLI, a test or a notebook.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # before anything imports pyplot; the figures below never need a display

from truestep.analysis.report.plots.ablation import plot_ablation  # noqa: E402
from truestep.analysis.report.plots.deviation import plot_deviation  # noqa: E402
from truestep.analysis.report.plots.envelope import plot_envelope, plot_state  # noqa: E402
from truestep.analysis.report.plots.loss import plot_loss  # noqa: E402
from truestep.analysis.report.plots.style import COLORS, DPI, LABELS  # noqa: E402
from truestep.analysis.report.plots.timeline import plot_timeline  # noqa: E402

__all__ = [
    "COLORS",
    "DPI",
    "LABELS",
    "plot_ablation",
    "plot_deviation",
    "plot_envelope",
    "plot_loss",
    "plot_state",
    "plot_timeline",
]
