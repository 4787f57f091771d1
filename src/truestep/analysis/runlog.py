"""A run directory as data: every metrics line and event, whichever attempt or process wrote it.

The analysis room reads only run directories, so it works the same on a run made here, under SLURM, or
on a cluster months ago. It never touches a live run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from truestep.core.names import EVENTS_FILE, METRICS_FILE
from truestep.telemetry.jsonl import read_jsonl


@dataclass
class RunLog:
    path: Path
    metrics: list[dict[str, Any]]
    events: list[dict[str, Any]]

    @classmethod
    def load(cls, path: Path | str) -> RunLog:
        path = Path(path)
        if not (path / METRICS_FILE).is_file():
            raise FileNotFoundError(f"{path} is not a truestep run directory (no {METRICS_FILE})")
        events = sorted(read_jsonl(path / EVENTS_FILE), key=lambda e: e["time"])
        return cls(path, read_jsonl(path / METRICS_FILE), events)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]

    @cached_property
    def final_steps(self) -> dict[int, dict[str, Any]]:
        """step -> the metrics line the run ended on (a step recomputed after a restart: its last line)."""
        final: dict[int, dict[str, Any]] = {}
        for line in self.metrics:
            final[line["step"]] = line
        return dict(sorted(final.items()))

    @cached_property
    def superseded(self) -> list[dict[str, Any]]:
        """Metrics lines of steps that a later attempt computed again: lost work."""
        kept = {id(line) for line in self.final_steps.values()}
        return [line for line in self.metrics if id(line) not in kept]

    @property
    def tokens_per_step(self) -> int:
        line = next(iter(self.final_steps.values()), None)
        return int(line["tokens_seen"] // line["step"]) if line else 0

    @property
    def start_time(self) -> float:
        """When the job began: its first event or metric, whichever launcher wrote it."""
        times = [e["time"] for e in self.events] + [m["time"] - m["step_time"] for m in self.metrics[:1]]
        return min(times)

    @property
    def end_time(self) -> float:
        times = [e["time"] for e in self.events] + [m["time"] for m in self.metrics]
        return max(times)

    @property
    def wall_s(self) -> float:
        return self.end_time - self.start_time

    def attempt_metrics(self, attempt: int) -> list[dict[str, Any]]:
        return [m for m in self.metrics if m["attempt"] == attempt]

    def checkpoint_digests(self) -> dict[int, str]:
        """step -> parameter digest written at that step's save (the last one, if saved twice)."""
        return {e["step"]: e["param_digest"] for e in self.named("checkpoint_save") if "param_digest" in e}

    def final_digest(self) -> str | None:
        ends = self.named("run_end")
        return ends[-1]["param_digest"] if ends else None

    def layout_changes(self) -> list[int]:
        return [e["step"] for e in self.named("checkpoint_restore") if e.get("layout_changed")]


def finite_abs_diff(a: float, b: float) -> float:
    """|a - b|, with any non-finite operand (NaN loss) counted as an infinite deviation unless both are
    the same non-finite value."""
    if math.isfinite(a) and math.isfinite(b):
        return abs(a - b)
    if math.isnan(a) and math.isnan(b):
        return 0.0
    return 0.0 if a == b else math.inf
