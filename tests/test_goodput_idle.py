"""Goodput knows when the job was not running (issue 24): a run relaunched after it completed keeps its
own wall clock and names the late attempt; a refused attempt is its own line, and the gap after it is
`not_running`, not the job's requeue wait. Hand-made run directories with answers worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis_cases import TOKENS, line, start, write_run
from truestep.analysis.goodput import goodput


def _end(attempt: int, at: float, step: int, reason: str) -> dict:
    return {"time": at, "event": "run_end", "attempt": attempt, "step": step, "reason": reason}


def test_a_run_relaunched_after_it_completed_keeps_its_wall_clock(tmp_path: Path) -> None:
    """Steps 1-10 end at 1+s; completed at 11.2. Relaunched 12 minutes later: attempt 1 restores the
    final checkpoint and ends at once. Without the rule the wall clock is 801.5 s."""
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 11)]
    events = [
        start(0, 0.5, 0.0),
        _end(0, 11.2, 10, "completed"),
        start(1, 800.5, 800.0),
        {"time": 801.0, "event": "checkpoint_restore", "attempt": 1, "step": 10, "restore_s": 0.4},
        _end(1, 801.5, 10, "completed"),
    ]
    g = goodput(write_run(tmp_path / "run", metrics, events), violation=None)
    assert g.wall_s == pytest.approx(11.2)
    assert g.after_completion == [1] and list(g.attempts) == [0]
    assert g.plain_tokens_per_s == pytest.approx(10 * TOKENS / 11.2)
    assert g.badput_s["other"] == pytest.approx(11.2 - 10.0 - 1.0)  # startup 0 -> 1.0 before step 1
    assert max(s.end for s in g.spans) <= 11.2


def test_a_refused_attempt_is_its_own_line_and_the_gap_after_it_is_not_running(tmp_path: Path) -> None:
    """Attempt 0 trains 1-5 (ending 2..6), is preempted (run_end 6.5). The requeue launches attempt 1 at
    99.5, which is refused at 100.0. Someone relaunches by hand: attempt 2 starts at 200.0, restores
    step 5 (0.5 s, done 200.5), trains 6-10 (ending 201.5..205.5) and completes at 206.0."""
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 6)] + [line(s, 2, 195.5 + s) for s in range(6, 11)]
    refused = {"error": "ConfigError", "message": "changed", "exit_code": 3}
    events = [
        start(0, 0.5, 0.0),
        _end(0, 6.5, 5, "preempted"),
        {"time": 99.5, "event": "rendezvous", "attempt": 1},
        {"time": 100.0, "event": "run_refused", "attempt": 1, **refused},
        start(2, 200.5, 200.0),
        {"time": 200.5, "event": "checkpoint_restore", "attempt": 2, "step": 5, "restore_s": 0.5},
        _end(2, 206.0, 10, "completed"),
    ]
    g = goodput(write_run(tmp_path / "run", metrics, events), violation=None)
    assert g.wall_s == pytest.approx(206.0) and g.after_completion == []
    assert g.badput_s["requeue_wait"] == pytest.approx(99.5 - 6.5)
    assert g.badput_s["refused"] == pytest.approx(0.5)
    assert g.badput_s["not_running"] == pytest.approx(200.0 - 100.0)
    assert g.badput_s["restore"] == pytest.approx(0.5) and g.badput_s["startup"] == pytest.approx(1.0)
    assert g.badput_s["other"] == pytest.approx(0.5 + 0.5)  # 6.0 -> 6.5 (saving, ending) and 205.5 -> 206.0
    kinds = [
        (s.kind, s.start, s.end) for s in g.spans if s.kind in ("requeue_wait", "refused", "not_running")
    ]
    assert kinds == [("requeue_wait", 6.5, 99.5), ("refused", 99.5, 100.0), ("not_running", 100.0, 200.0)]
