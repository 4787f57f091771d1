"""A run directory as data: every metrics line and event, whichever attempt or process wrote it.

The analysis room reads only run directories, so it works the same on a run made here, under SLURM, or
on a cluster months ago. It never touches a live run. A directory that is not a run, or whose logs do
not parse, is refused with `RunLogError` (one line on the CLI, exit code 3), never a traceback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from truestep.core.errors import RefusedError
from truestep.core.names import EVENTS_FILE, METRICS_FILE
from truestep.telemetry.jsonl import read_jsonl

METRIC_FIELDS = ("step", "loss", "grad_norm", "time", "step_time", "attempt", "tokens_seen")
"""What every metrics line must hold for the measures to be computed."""


class RunLogError(RefusedError):
    """A directory the instrument cannot use (not a run, unreadable logs, a floor run that is not one)."""


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        return read_jsonl(path)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise RunLogError(f"cannot read {path}: {err}") from err


@dataclass
class RunLog:
    path: Path
    metrics: list[dict[str, Any]]
    events: list[dict[str, Any]]

    @classmethod
    def load(cls, path: Path | str) -> RunLog:
        path = Path(path)
        if not (path / METRICS_FILE).is_file():
            raise RunLogError(f"{path} is not a truestep run directory (no {METRICS_FILE})")
        metrics = _read(path / METRICS_FILE)
        for number, line in enumerate(metrics, 1):
            absent = [k for k in METRIC_FIELDS if k not in line]
            if absent:
                raise RunLogError(f"{path / METRICS_FILE}: record {number} lacks {', '.join(absent)}")
        events = _read(path / EVENTS_FILE)
        for number, event in enumerate(events, 1):
            if "time" not in event or "event" not in event:
                raise RunLogError(f"{path / EVENTS_FILE}: record {number} lacks time or event")
        return cls(path, metrics, sorted(events, key=lambda e: e["time"]))

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
        """Tokens of one step, from the first line past step 0 (a step-0 line has no rate to give)."""
        line = next((m for m in self.final_steps.values() if m["step"] > 0), None)
        return int(line["tokens_seen"] // line["step"]) if line else 0

    @property
    def start_time(self) -> float:
        """When the job began: the first process start (run_start.process_start, written as the process
        imported truestep), the first event or the first step's start, whichever came first."""
        times = [e["time"] for e in self.events]
        times += [float(e["process_start"]) for e in self.named("run_start") if "process_start" in e]
        times += [m["time"] - m["step_time"] for m in self.metrics]
        return min(times) if times else 0.0

    @property
    def end_time(self) -> float:
        times = [e["time"] for e in self.events] + [m["time"] for m in self.metrics]
        return max(times) if times else 0.0

    @property
    def wall_s(self) -> float:
        return self.end_time - self.start_time

    def attempt_metrics(self, attempt: int) -> list[dict[str, Any]]:
        return [m for m in self.metrics if m["attempt"] == attempt]

    def digests(self) -> dict[int, str]:
        """step -> parameter digest logged at that step: every checkpoint save, and the run's end (the
        last one logged for a step wins: a step saved again after a restart)."""
        found = {e["step"]: e["param_digest"] for e in self.named("checkpoint_save") if "param_digest" in e}
        for end in self.named("run_end"):
            if "param_digest" in end and "step" in end:
                found[end["step"]] = end["param_digest"]
        return dict(sorted(found.items()))

    def fingerprints(self) -> list[str]:
        """The distinct config fingerprints of the run's attempts, in order of appearance."""
        seen = [e["config_fingerprint"] for e in self.named("run_start") if "config_fingerprint" in e]
        return list(dict.fromkeys(seen))

    def layout_changes(self) -> list[int]:
        return [e["step"] for e in self.named("checkpoint_restore") if e.get("layout_changed")]

    def fault_specs(self) -> list[str]:
        return [str(e.get("spec", e.get("kind", "?"))) for e in self.named("fault_injected")]


def finite_abs_diff(a: float, b: float) -> float:
    """|a - b|, with any non-finite operand (NaN loss) counted as an infinite deviation unless both are
    the same non-finite value."""
    if math.isfinite(a) and math.isfinite(b):
        return abs(a - b)
    if math.isnan(a) and math.isnan(b):
        return 0.0
    return 0.0 if a == b else math.inf
