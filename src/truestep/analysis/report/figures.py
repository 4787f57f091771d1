"""The report's figures for a whole experiment: which plot is drawn for which run, into OUT/plots/, and
the Image blocks that place them in the report. A figure that fails becomes a note, never a failed report.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from truestep.analysis.report.blocks import Image
from truestep.analysis.report.document import ordered_runs
from truestep.analysis.report.format import finite
from truestep.analysis.runlog import RunLog
from truestep.core.names import METRICS_FILE


def _run_dir(out: Path, name: str, analysis: dict[str, Any]) -> Path | None:
    for candidate in (out / "runs" / name, Path(analysis.get("path", ""))):
        if (candidate / METRICS_FILE).is_file():
            return candidate
    return None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def make_plots(out: Path, summary: dict[str, Any]) -> dict[str, list[Any]]:
    """Write OUT/plots/*.png; returns run name -> [Image], plus 'ablation', 'floor-band' and
    'notes' (plots that could not be drawn, and why)."""
    from truestep.analysis.report import plots  # matplotlib is imported only when a report is made

    plot_dir = out / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    runs = summary.get("runs", {})
    floor = summary.get("floor") or {}
    margin = summary.get("margin", 2.0)
    floor_value = floor.get("max_dloss") if finite(floor.get("max_dloss")) else 0.0
    images: dict[str, list[Any]] = {"notes": []}
    logs: dict[str, RunLog] = {}
    for name, analysis in runs.items():
        where = _run_dir(out, name, analysis)
        if where is None:
            images["notes"].append(f"run directory of `{name}` not found: no plots for it")
            continue
        logs[name] = RunLog.load(where)
    ref = logs.get("reference")

    def attempt(key: str, caption: str, draw: Any) -> None:
        try:
            images.setdefault(key, []).append(Image(caption, draw()))
        except Exception as err:  # a figure must never cost the whole report
            warnings.warn(f"plot '{caption}' failed: {err!r}", stacklevel=2)
            images["notes"].append(f"plot '{caption}' failed: {type(err).__name__}: {err}")

    for name in ordered_runs(summary):
        run, analysis = logs.get(name), runs[name]
        if run is None or name == "reference":
            continue
        fid = analysis.get("fidelity") or {}
        violation = analysis.get("first_violation_step")
        stem = _safe(name)
        if ref is not None:
            key = "floor-band" if name == "floor" else name
            if name != "floor":
                attempt(
                    key,
                    f"Loss of `{name}` against the reference (faint x: steps later redone)",
                    lambda run=run, stem=stem, name=name: plots.plot_loss(
                        ref, run, plot_dir / f"loss-{stem}.png", f"loss: {name} vs reference"
                    ),
                )
            attempt(
                key,
                f"|Δloss| of `{name}` against the reference (0 = bitwise equal, drawn at the bottom)",
                lambda run=run, stem=stem, name=name, violation=violation, fid=fid: plots.plot_deviation(
                    ref,
                    run,
                    floor_value,
                    margin,
                    plot_dir / f"deviation-{stem}.png",
                    title=f"deviation from the reference: {name}",
                    violation=violation,
                    divergent=fid.get("first_divergent_step"),
                ),
            )
        if name != "floor":
            attempt(
                name,
                f"Wall-clock timeline of `{name}`",
                lambda run=run, stem=stem, name=name, violation=violation: plots.plot_timeline(
                    run, plot_dir / f"timeline-{stem}.png", violation=violation, title=f"timeline: {name}"
                ),
            )
    if summary.get("ablation"):
        attempt(
            "ablation",
            "Ablation: plain vs correct goodput per cell (flagged cells marked)",
            lambda: plots.plot_ablation(summary, plot_dir / "ablation.png"),
        )
    return images
