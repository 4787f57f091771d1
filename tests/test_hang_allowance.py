"""The hang rule grows with the job's own steps (resilience.hang_step_multiple): the supervisor's watch
(resilience/watch.py) on real heartbeat files and a real live process, in-process. The allowance is the
floor (hang_timeout_s) until a step has been timed, then max(floor, multiple x the longest step timed);
a step still running never lengthens it. Only lower bounds on time are asserted (a loaded machine only
makes the measured step longer)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from truestep.config.schema import ResilienceConfig
from truestep.core.status import Phase
from truestep.resilience.heartbeat import heartbeat_path
from truestep.resilience.watch import AttemptWatch, Failure, Rank

FLOOR_S = 0.3
STEP_S = 0.2


@pytest.fixture
def rank() -> Iterator[Rank]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield Rank(0, proc, time.time())
    finally:
        proc.kill()
        proc.wait()


def beat(run_dir: Path, rank: Rank, step: int, phase: Phase = Phase.TRAIN) -> None:
    path = heartbeat_path(run_dir, rank.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": rank.proc.pid,
        "rank": 0,
        "attempt": 0,
        "time": time.time(),
        "step": step,
        "phase": phase,
    }
    path.write_text(json.dumps(record))


def stall_until_declared(watch: AttemptWatch, run_dir: Path, rank: Rank, step: int) -> tuple[Failure, float]:
    """Keep the rank alive at `step` (fresh beats, no progress) until the watch declares it hung."""
    since = time.time()
    while True:
        beat(run_dir, rank, step)
        failure = watch.check()
        if failure is not None:
            return failure, time.time() - since
        assert time.time() - since < 30, "never declared hung"
        time.sleep(0.02)


def timed_steps(watch: AttemptWatch, run_dir: Path, rank: Rank, steps: int) -> None:
    """`steps` training steps of at least STEP_S each, seen by the watch as they complete."""
    for step in range(1, steps + 1):
        beat(run_dir, rank, step)
        assert watch.check() is None
        time.sleep(STEP_S)
    beat(run_dir, rank, steps + 1)
    assert watch.check() is None


def test_the_allowance_grows_with_the_longest_step(tmp_path: Path, rank: Rank) -> None:
    cfg = ResilienceConfig(hang_timeout_s=FLOOR_S, hang_step_multiple=5.0, liveness_timeout_s=30.0)
    watch = AttemptWatch(tmp_path, [rank], cfg)
    assert watch.hang_allowance() == FLOOR_S  # nothing timed yet: the floor is the whole rule
    timed_steps(watch, tmp_path, rank, 2)
    assert watch.longest_step_s >= STEP_S
    allowance = watch.hang_allowance()
    assert allowance == 5.0 * watch.longest_step_s >= 5.0 * STEP_S > FLOOR_S
    failure, stalled = stall_until_declared(watch, tmp_path, rank, 3)
    assert failure.kind == "no_progress" and stalled > allowance, (failure, stalled)
    assert "resilience.hang_step_multiple=5 x the longest step" in failure.detail, failure.detail
    assert watch.hang_allowance() == allowance  # the stalled step did not lengthen its own allowance


def test_multiple_zero_keeps_the_fixed_timeout(tmp_path: Path, rank: Rank) -> None:
    cfg = ResilienceConfig(hang_timeout_s=FLOOR_S, hang_step_multiple=0.0, liveness_timeout_s=30.0)
    watch = AttemptWatch(tmp_path, [rank], cfg)
    timed_steps(watch, tmp_path, rank, 2)
    failure, stalled = stall_until_declared(watch, tmp_path, rank, 3)
    assert stalled > FLOOR_S and failure.kind == "no_progress"
    assert "resilience.hang_timeout_s=0.3" in failure.detail, failure.detail


def test_only_steps_taken_while_every_rank_trained_are_timed(tmp_path: Path, rank: Rank) -> None:
    """A long checkpoint between two steps is another phase: it is not a step, so not timed."""
    cfg = ResilienceConfig(hang_timeout_s=FLOOR_S, hang_step_multiple=5.0, liveness_timeout_s=30.0)
    watch = AttemptWatch(tmp_path, [rank], cfg)
    beat(tmp_path, rank, 1)
    assert watch.check() is None
    beat(tmp_path, rank, 1, Phase.CHECKPOINT)
    assert watch.check() is None
    time.sleep(1.0)  # a slow save
    beat(tmp_path, rank, 2)
    assert watch.check() is None
    assert watch.longest_step_s == 0.0 and watch.hang_allowance() == FLOOR_S


def test_a_restart_keeps_what_was_timed(tmp_path: Path, rank: Rank) -> None:
    cfg = ResilienceConfig(hang_timeout_s=FLOOR_S, hang_step_multiple=5.0)
    assert AttemptWatch(tmp_path, [rank], cfg, longest_step_s=2.0).hang_allowance() == 10.0
