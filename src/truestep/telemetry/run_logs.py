"""The run directory's two machine-readable logs: metrics.jsonl (one line per step) and events.jsonl.

Only the main rank writes them; other ranks get no-op logs, so call sites need no rank checks. Every
record carries the job-wide attempt number (the run directory lease's incarnation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from truestep.core.names import EVENTS_FILE, METRICS_FILE
from truestep.telemetry.jsonl import JsonlWriter


class RunLogs:
    def __init__(self, run_dir: Path, attempt: int, enabled: bool) -> None:
        self.run_dir = run_dir
        self.attempt = attempt
        self.enabled = enabled
        self._metrics = JsonlWriter(run_dir / METRICS_FILE, {"attempt": attempt}) if enabled else None
        self._events = JsonlWriter(run_dir / EVENTS_FILE, {"attempt": attempt}) if enabled else None

    def event(self, event: str, **fields: Any) -> None:
        if self._events is not None:
            self._events.write({"event": event, **fields})

    def metrics(self, **fields: Any) -> None:
        if self._metrics is not None:
            self._metrics.write(fields)

    def close(self) -> None:
        for writer in (self._metrics, self._events):
            if writer is not None:
                writer.close()
