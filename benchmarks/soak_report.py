"""The soak's verdicts on what it sampled: bounded or not (first vs last quarter), the table, the plots.

A resource is bounded when its largest value in the last quarter of the job (by wall time) is within
its noise allowance of the largest in the first quarter: `last_max <= first_max * (1 + rel) + abs`.
Both allowances are stated with every result. The append-only logs (events.jsonl, metrics.jsonl) must
grow -- they are the job's record -- so for them the *rate* is judged: bytes per trained step and per
attempt in the first vs the last quarter. Quarantine entries must stay within `keep_quarantined`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

LEVELS: dict[str, tuple[str, float, float, float]] = {
    # metric: (label, unit divisor, relative allowance, absolute allowance in the metric's own unit)
    "supervisor_rss_kb": ("supervisor RSS (MB)", 1024, 0.10, 0),
    "supervisor_fds": ("supervisor open fds", 1, 0.0, 2),
    "supervisor_threads": ("supervisor threads", 1, 0.0, 1),
    "children": ("child processes", 1, 0.0, 0),
    "standby_rss_kb": ("parked standby RSS (MB)", 1024, 0.10, 0),
    "run_dir_bytes_held": ("run dir without records, quarantine (MB)", 1 << 20, 0.25, 0),
    "quarantine_entries": ("quarantine entries", 1, 0.0, 0),
}
"""Level metrics: what must not grow. The run directory without its records and quarantine holds
keep_last_n checkpoints, one being written and small files: 25% covers a save in flight at the sample."""
RATES = {"events_bytes": "events.jsonl", "metrics_bytes": "metrics.jsonl", "attempts_bytes": "attempts/"}


@dataclass
class Bound:
    metric: str
    label: str
    first_median: float
    first_max: float
    last_median: float
    last_max: float
    allowance: str
    bounded: bool


def quarters(samples: list[dict]) -> tuple[list[dict], list[dict]]:
    t0, t1 = samples[0]["time"], samples[-1]["time"]
    span = t1 - t0
    first = [s for s in samples if s["time"] <= t0 + span / 4]
    last = [s for s in samples if s["time"] >= t1 - span / 4]
    return first, last


def level_bounds(samples: list[dict], keep_quarantined: int) -> list[Bound]:
    first, last = quarters(samples)
    out = []
    for metric, (label, unit, rel, slack) in LEVELS.items():
        a = [s[metric] for s in first]
        b = [s[metric] for s in last]
        if metric == "quarantine_entries":
            # Pruned after each commit: a resume that quarantines adds one until the next commit.
            limit = keep_quarantined + 1 if keep_quarantined > 0 else float("inf")
            ok = max(s[metric] for s in samples) <= limit and samples[-1][metric] <= keep_quarantined
            allowance = f"<= keep_quarantined={keep_quarantined} + 1 always, <= {keep_quarantined} at the end"
        else:
            ok = max(b) <= max(a) * (1 + rel) + slack
            allowance = f"last max <= first max x {1 + rel:.2f} + {slack:g}"
        out.append(
            Bound(metric, label, statistics.median(a) / unit, max(a) / unit, statistics.median(b) / unit,
                  max(b) / unit, allowance, ok)
        )  # fmt: skip
    return out


def log_rates(samples: list[dict], steps_in: dict[int, float]) -> dict[str, dict[str, float]]:
    """Bytes per trained step of each record over the first and the last quarter. `steps_in` maps a
    sample's index to the steps trained (replays included) by then."""
    first, last = quarters(samples)
    out: dict[str, dict[str, float]] = {}
    for metric, name in RATES.items():
        rates = []
        for part in (first, last):
            i, j = samples.index(part[0]), samples.index(part[-1])
            steps = steps_in[j] - steps_in[i]
            rates.append((part[-1][metric] - part[0][metric]) / steps if steps > 0 else float("nan"))
        out[name] = {"first_bytes_per_step": rates[0], "last_bytes_per_step": rates[1]}
    return out


def table(bounds: list[Bound]) -> str:
    rows = ["| resource | first quarter median / max | last quarter median / max | noise allowance | bounded |",
            "|---|---|---|---|---|"]  # fmt: skip
    for b in bounds:
        rows.append(
            f"| {b.label} | {b.first_median:.1f} / {b.first_max:.1f} | {b.last_median:.1f} / {b.last_max:.1f} "
            f"| {b.allowance} | {'yes' if b.bounded else 'NO'} |"
        )
    return "\n".join(rows)


def plot(samples: list[dict], fault_times: list[float], launches: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = samples[0]["time"]
    minutes = [(s["time"] - t0) / 60 for s in samples]
    panels = [
        ("supervisor_rss_kb", "supervisor RSS (MB)", 1024),
        ("standby_rss_kb", "parked standby RSS (MB)", 1024),
        ("supervisor_fds", "supervisor open fds", 1),
        ("supervisor_threads", "supervisor threads", 1),
        ("children", "child processes", 1),
        ("run_dir_bytes", "run dir (MB): all / without records and quarantine", 1 << 20),
        ("events_bytes", "events.jsonl (KB)", 1024),
        ("quarantine_entries", "quarantine entries", 1),
    ]
    fig, axes = plt.subplots(4, 2, figsize=(11, 11), sharex=True)
    for ax, (metric, title, unit) in zip(axes.flat, panels, strict=True):
        ax.plot(minutes, [s[metric] / unit for s in samples], lw=0.8)
        if metric == "run_dir_bytes":
            ax.plot(minutes, [s["run_dir_bytes_held"] / unit for s in samples], lw=0.8)
        for t in fault_times:
            ax.axvline((t - t0) / 60, color="#d32f2f", lw=0.4, alpha=0.5)
        for t in launches[1:]:
            ax.axvline((t - t0) / 60, color="#1e88e5", lw=0.6, ls="--", alpha=0.7)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0)
    for ax in axes[-1]:
        ax.set_xlabel("minutes since the soak started")
    fig.suptitle("soak: resources over time (red: a fault fired, blue dashed: relaunch after a preemption)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
