"""Hand-made run directories for the analysis tests: metrics and events shaped like what the trainer,
the supervisor and the fault hooks write, on a simulated clock, so every measure's answer is known."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path

from truestep.analysis.runlog import RunLog

TOKENS = 256
FINGERPRINT = "f00dfeedf00dfeed"
PROVENANCE = {
    "truestep_version": "0.1.0",
    "source_sha256": "c0de" * 16,
    "torch_version": "2.13.0+cpu",
    "data_sha256": "da7a" * 16,
    "init_from_sha256": "",
}
"""What every hand-made run records it ran: the same code, data and torch (analysis/provenance.py)."""
_RUNS = itertools.count(1)
"""Each hand-made run starts at its own instant (as real runs do): two runs with the same start times
are one run copied, and the floor counts a copy once."""


def loss_of(step: int) -> float:
    return 10.0 - step * 0.5


def line(
    step: int,
    attempt: int,
    end: float,
    loss: float | None = None,
    step_time: float = 1.0,
    grad: float | None = None,
) -> dict:
    return {
        "step": step,
        "attempt": attempt,
        "time": end,
        "step_time": step_time,
        "loss": loss_of(step) if loss is None else loss,
        "grad_norm": 1.0 + step * 0.01 if grad is None else grad,
        "lr": 1e-3,
        "tokens_seen": step * TOKENS,
    }


def start(
    attempt: int, at: float, process_start: float | None = None, fingerprint: str = FINGERPRINT
) -> dict:
    return {
        "time": at,
        "event": "run_start",
        "attempt": attempt,
        "process_start": at if process_start is None else process_start,
        "config_fingerprint": fingerprint,
        "provenance": dict(PROVENANCE),
    }


def write_run(path: Path, metrics: list[dict], events: list[dict]) -> RunLog:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return RunLog.load(path)


def clean(
    path: Path,
    steps: int = 10,
    loss: Callable[[int], float] | None = None,
    grad: Callable[[int], float] | None = None,
    digest: str = "final",
    fingerprint: str = FINGERPRINT,
) -> RunLog:
    """A failure-free run: steps 1..N ending at 1 + s, one attempt, run_end with a digest."""
    loss = loss or loss_of
    metrics = [line(s, 0, 1.0 + s, loss(s), grad=grad(s) if grad else None) for s in range(1, steps + 1)]
    events = [
        start(0, 0.5 + 1e-6 * next(_RUNS), 0.0, fingerprint),
        {"time": steps + 1.1, "event": "run_end", "attempt": 0, "step": steps, "param_digest": digest},
    ]
    return write_run(path, metrics, events)


def noisy(scale: float, seed: int) -> Callable[[int], float]:
    """A loss curve with a same-seed-like deviation that grows with the step (tiny early, large late)."""
    return lambda s: loss_of(s) + scale * math.sin(seed * 7.1 + s) * s


def killed_and_resumed(path: Path, later_loss: Callable[[int], float | None] | None = None) -> RunLog:
    """Attempt 0 trains steps 1-6 (1 s each, step k ends at 1+k), saves at 5, is killed at 7.5; the
    supervisor detects at 8.0, tears down by 8.5, relaunches at 8.6; attempt 1 starts at 9.0, restores
    step 5 by 10.0 (0.5 s), recomputes 6-10 ending at 11.5..15.5."""
    later_loss = later_loss or (lambda s: None)
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 7)]
    metrics += [line(s, 1, 11.5 + s - 6, later_loss(s)) for s in range(6, 11)]
    sup = {"source": "supervisor"}
    events = [
        {"time": 0.0, "event": "supervisor_start", **sup},
        {"time": 0.0, "event": "attempt_start", "attempt": 0, **sup},
        start(0, 0.5, 0.0),
        {
            "time": 6.1,
            "event": "checkpoint_save",
            "attempt": 0,
            "step": 5,
            "blocking_s": 0.25,
            "param_digest": "d5",
        },
        {
            "time": 7.5,
            "event": "fault_injected",
            "source": "fault",
            "kind": "kill",
            "step": 7,
            "rank": 1,
            "attempt": 0,
            "spec": "kill:rank=1:step=7",
        },
        {
            "time": 8.0,
            "event": "failure_detected",
            "attempt": 0,
            "detected_at": 8.0,
            "kind": "process_exit",
            **sup,
        },
        {"time": 8.5, "event": "teardown_complete", "teardown_s": 0.5, **sup},
        {"time": 8.6, "event": "attempt_start", "attempt": 1, **sup},
        start(1, 9.5, 9.0),
        {
            "time": 10.0,
            "event": "checkpoint_restore",
            "attempt": 1,
            "step": 5,
            "restore_s": 0.5,
            "layout_changed": False,
        },
        {"time": 15.6, "event": "run_end", "attempt": 1, "step": 10, "param_digest": "final"},
    ]
    return write_run(path, metrics, events)


def restarted_from_scratch(path: Path, steps_after: int) -> RunLog:
    """Attempt 0 logs steps 1-3 and is killed at t=4.2 before any checkpoint; attempt 1 (relaunched at
    4.5) starts over and logs steps 1..`steps_after`."""
    sup = {"source": "supervisor"}
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 4)] + [
        line(s, 1, 10.0 + s) for s in range(1, steps_after + 1)
    ]
    events = [
        {"time": 0.0, "event": "attempt_start", "attempt": 0, **sup},
        start(0, 0.5, 0.0),
        {"time": 4.2, "event": "fault_injected", "kind": "kill", "attempt": 0, "spec": "kill"},
        {"time": 4.3, "event": "failure_detected", "attempt": 0, "detected_at": 4.3, **sup},
        {"time": 4.4, "event": "teardown_complete", "teardown_s": 0.1, **sup},
        {"time": 4.5, "event": "attempt_start", "attempt": 1, **sup},
        start(1, 9.5, 9.0),
    ]
    return write_run(path, metrics, events)
