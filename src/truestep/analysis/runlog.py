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

from truestep.checkpoint.catalog import (
    is_committed,
    quarantined_dirs,
    run_checkpoint_root,
    set_aside_step,
    step_dirs,
)
from truestep.core.errors import RefusedError
from truestep.core.names import EVENTS_FILE, METRICS_FILE
from truestep.telemetry.jsonl import read_jsonl

METRIC_FIELDS = ("step", "loss", "grad_norm", "time", "step_time", "attempt", "tokens_seen")
"""What every metrics line must hold for the measures to be computed. Every other numeric field (the
learning rate among them) is an observable compared where both lines log it (telemetry/lines.py)."""
DIGEST_LOGGED = "param_digest_logged"
"""run_start field: false when the run's maker cannot log a parameter digest (`truestep audit` of a job
without --weights): a reference or floor run then ends with a run_end without one, and the verdict counts
the final parameters as not compared."""
PRECISION = "logged_precision"
"""run_start field: observable -> the step its values were rounded to before they were logged (a trainer
that logs a loss at 4 decimals: 1e-4). Differences below it cannot be seen; the floor's envelope is at
least that step (analysis/floor.py)."""
EVIDENCE_GAP = "evidence_gap"
"""An event by which a run's maker declares evidence it knows is missing (a fault that never fired, a
restart that started over instead of resuming): the verdict lists each as a gap (analysis/verdict.py)."""


class RunLogError(RefusedError):
    """A directory the instrument cannot use (not a run, unreadable logs, a floor run that is not one)."""


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        return read_jsonl(path)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise RunLogError(f"cannot read {path}: {err}") from err


def _is_number(value: Any, integer: bool = False) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if integer else isinstance(value, int | float)


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
            wrong = [k for k in METRIC_FIELDS if not _is_number(line[k], integer=k in ("step", "attempt"))]
            if wrong:
                raise RunLogError(f"{path / METRICS_FILE}: record {number}: {', '.join(wrong)} not a number")
        events = _read(path / EVENTS_FILE)
        for number, event in enumerate(events, 1):
            if "time" not in event or "event" not in event:
                raise RunLogError(f"{path / EVENTS_FILE}: record {number} lacks time or event")
            wrong = [
                k
                for k in ("step", "attempt")
                if event.get(k) is not None and not _is_number(event[k], integer=True)
            ]
            if wrong or not _is_number(event["time"]):
                where = f"{path / EVENTS_FILE}: record {number}"
                raise RunLogError(f"{where}: {', '.join(wrong) or 'time'} not a number")
        return cls(path, metrics, sorted(events, key=lambda e: e["time"]))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]

    @cached_property
    def final_steps(self) -> dict[int, dict[str, Any]]:
        """step -> the line the run is judged on: of a step logged more than once, the line of the latest
        attempt (the one recomputed after a restart), and within one attempt the last one written (a step
        recomputed after a NaN rollback). File order alone would let a stale line appended late win."""
        final: dict[int, tuple[int, int, dict[str, Any]]] = {}
        for index, line in enumerate(self.metrics):
            key = (int(line["attempt"]), index)
            held = final.get(line["step"])
            if held is None or key > held[:2]:
                final[line["step"]] = (*key, line)
        return {step: held[2] for step, held in sorted(final.items())}

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

    def digest_records(self) -> dict[int, list[tuple[int, str]]]:
        """step -> every (attempt, parameter digest) logged for it (each checkpoint save and the run's
        end), in the order written."""
        found: dict[int, list[tuple[int, str]]] = {}
        for e in self.events:
            if e.get("event") in ("checkpoint_save", "run_end") and "param_digest" in e and "step" in e:
                found.setdefault(int(e["step"]), []).append(
                    (int(e.get("attempt") or 0), str(e["param_digest"]))
                )
        return dict(sorted(found.items()))

    def digests(self) -> dict[int, str]:
        """step -> the parameter digest the run is judged on at that step: the latest attempt's (a step
        saved again after a restart), as for metrics lines."""
        return {
            step: max(enumerate(records), key=lambda r: (r[1][0], r[0]))[1][1]
            for step, records in self.digest_records().items()
        }

    def attempt_fingerprints(self) -> dict[int, str | None]:
        """attempt -> the config fingerprint its run_start logged (None: it logged none). An attempt that
        wrote metrics lines without any run_start is absent."""
        found: dict[int, str | None] = {}
        for e in self.named("run_start"):
            fp = e.get("config_fingerprint")
            found.setdefault(int(e.get("attempt") or 0), fp if isinstance(fp, str) else None)
        return found

    def trajectory_keys(self, attempt: int | None = None) -> dict[str, Any] | None:
        """The trajectory keys an attempt's run_start logged (the first attempt's by default); None when
        not logged (runs made before the keys were)."""
        for e in self.named("run_start"):
            keys = e.get("trajectory_keys")
            if (attempt is None or int(e.get("attempt") or 0) == attempt) and isinstance(keys, dict):
                return keys
        return None

    def layouts(self) -> list[str]:
        """The distinct layouts (`run_start.layout`) of the run's attempts, in order of appearance."""
        return list(dict.fromkeys(str(e["layout"]) for e in self.named("run_start") if "layout" in e))

    @property
    def identity(self) -> tuple[tuple[Any, Any, Any], ...]:
        """Which process each attempt was, as logged (its start, its run_start's time, its pid): two
        directories with the same identity hold one run (a copy), whatever their paths. The pid is part
        of it because two runs launched side by side can log both times within one float's resolution
        (~0.24 us at today's epoch; seen in CI: a reference and another run refused as copies)."""
        return tuple((e.get("process_start"), e["time"], e.get("pid")) for e in self.named("run_start"))

    def skipped_steps(self, attempt: int) -> list[int]:
        """Steps the NaN guard skipped (non-finite loss or gradients) in one attempt."""
        return [
            int(e["step"])
            for e in self.named("nonfinite_step_skipped")
            if int(e.get("attempt") or 0) == attempt and "step" in e
        ]

    def fingerprints(self) -> list[str]:
        """The distinct config fingerprints of the run's attempts, in order of appearance."""
        seen = [e["config_fingerprint"] for e in self.named("run_start") if "config_fingerprint" in e]
        return list(dict.fromkeys(seen))

    def precision(self) -> dict[str, float]:
        """Observable -> the rounding step its logged values carry, as every attempt's run_start declared
        it (the largest where attempts differ)."""
        found: dict[str, float] = {}
        for e in self.named("run_start"):
            declared = e.get(PRECISION)
            for name, step in declared.items() if isinstance(declared, dict) else ():
                if _is_number(step) and math.isfinite(step) and step > 0:
                    found[str(name)] = max(found.get(str(name), 0.0), float(step))
        return found

    def logs_param_digest(self) -> bool:
        """False when a run_start declared that this run cannot log a parameter digest."""
        return not any(e.get(DIGEST_LOGGED) is False for e in self.named("run_start"))

    def declared_gaps(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(what, steps, detail) of every evidence_gap event, in the order written."""
        found = []
        for e in self.named(EVIDENCE_GAP):
            steps = e.get("steps")
            steps = (
                tuple(int(s) for s in steps if _is_number(s, integer=True)) if isinstance(steps, list) else ()
            )
            found.append((str(e.get("what", "evidence missing")), steps, str(e.get("detail", ""))))
        return found

    def layout_changes(self) -> list[int]:
        return [e["step"] for e in self.named("checkpoint_restore") if e.get("layout_changed")]

    def commit_evidence(self) -> dict[int, str]:
        """step -> why the run's checkpoint of that step counts as committed: its `checkpoint_commit`
        event; else a resume that verified its commit marker (`checkpoint_verified`); else its marker on
        disk, live or quarantined. The event alone is not the commit: rank 0 killed between writing the
        marker and logging the event leaves a committed checkpoint with no event, and a later restore of
        it is a restore of a committed checkpoint. A restore by itself is no evidence (with
        checkpoint.atomic_commit=false a torn one is restored too)."""
        found: dict[int, str] = {}
        for e in self.named("checkpoint_commit"):
            if isinstance(e.get("step"), int):
                found.setdefault(e["step"], "its checkpoint_commit event")
        for e in self.named("checkpoint_verified"):
            if isinstance(e.get("step"), int):
                found.setdefault(e["step"], "its commit marker, verified at a resume")
        root = run_checkpoint_root(self.path)
        for ckpt_dir in step_dirs(root) + quarantined_dirs(root):
            step = set_aside_step(ckpt_dir)
            if step is not None and is_committed(ckpt_dir):
                found.setdefault(step, "its commit marker on disk")
        return dict(sorted(found.items()))

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
