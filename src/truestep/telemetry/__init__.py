"""metrics.jsonl / events.jsonl writers (timestamps, attempt id), console progress, TensorBoard."""

from truestep.telemetry.jsonl import JsonlWriter, read_jsonl
from truestep.telemetry.progress import Progress
from truestep.telemetry.run_logs import EVENTS_FILE, METRICS_FILE, RunLogs, next_attempt

__all__ = ["EVENTS_FILE", "METRICS_FILE", "JsonlWriter", "Progress", "RunLogs", "next_attempt", "read_jsonl"]
