"""The run directory's two machine-readable logs: metrics.jsonl (one line per step) and events.jsonl.

Only the main rank writes them; other ranks get no-op logs, so call sites need no rank checks. Every
record carries the job-wide attempt number (the run directory lease's incarnation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from truestep.core.names import EVENTS_FILE, METRICS_FILE
from truestep.telemetry.jsonl import JsonlWriter, iter_jsonl
from truestep.telemetry.narrate import Narrator

SAVE_DURATIONS = {"write_s": "checkpoint_written", "commit_s": "checkpoint_commit"}
"""Duration fields of the save events, remembered for `longest_save_s` (field -> the event carrying it)."""


class RunLogs:
    def __init__(self, run_dir: Path, attempt: int, enabled: bool, narrator: Narrator | None = None) -> None:
        self.run_dir = run_dir
        self.attempt = attempt
        self.enabled = enabled
        self.narrator = narrator if enabled else None
        if self.narrator is not None:
            self.narrator.failure_time = self.failure_time
        self._longest: dict[str, float] = {}
        self._metrics = JsonlWriter(run_dir / METRICS_FILE, {"attempt": attempt}) if enabled else None
        self._events = JsonlWriter(run_dir / EVENTS_FILE, {"attempt": attempt}) if enabled else None

    def event(self, event: str, **fields: Any) -> None:
        for key in SAVE_DURATIONS:  # remembered on every rank, including those that write no log
            value = fields.get(key) if event == SAVE_DURATIONS[key] else None
            if isinstance(value, int | float):
                self._longest[key] = max(self._longest.get(key, 0.0), float(value))
        if self._events is not None:
            record = self._events.write({"event": event, **fields})
            if self.narrator is not None:
                self.narrator.tell(record)

    def metrics(self, **fields: Any) -> None:
        if self._metrics is not None:
            record = self._metrics.write(fields)
            if self.narrator is not None:
                self.narrator.metrics(record)

    def longest_save_s(self) -> float:
        """The longest checkpoint save this rank has logged so far: written (from the save's start) plus
        committed; 0 before the first. For rules that grow with the job's own costs (the graceful-stop
        deadline, ResilienceConfig.exit_allowance)."""
        return self._longest.get("write_s", 0.0) + self._longest.get("commit_s", 0.0)

    def failure_time(self) -> float | None:
        """When the supervisor detected the failure that ended the previous attempt (None: none did). Read
        bounded and tolerant (`iter_jsonl`): the log says how long recovery took, it cannot stop one."""
        detected = [
            r.get("detected_at")
            for r in iter_jsonl(self.run_dir / EVENTS_FILE)
            if r.get("event") == "failure_detected" and r.get("attempt") == self.attempt - 1
        ]
        last = detected[-1] if detected else None
        return float(last) if isinstance(last, int | float) else None

    def close(self) -> None:
        for writer in (self._metrics, self._events):
            if writer is not None:
                writer.close()
