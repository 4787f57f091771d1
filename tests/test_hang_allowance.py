"""The hang rule grows with the job's own steps (resilience.hang_step_multiple): the supervisor's watch
(supervisor/watch.py) on real heartbeat files and a real live process, in-process. The allowance is the
floor (hang_timeout_s) until a rank has reported a completed step's duration (`longest_step_s` in
its heartbeat), then max(floor, multiple x the longest reported); a step still running never lengthens it.
Only lower bounds on time are asserted (a loaded machine only makes a stall look longer). The same rule
on real training processes: tests/test_resilience.py. Also the watch's two other time rules: a rank
that is importing torch may be silent for startup_timeout_s (loading holds the GIL), and of a pause of the
watcher itself only the part beyond OBSERVER_PAUSE_S counts."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from truestep.config.schema import ResilienceConfig
from truestep.core.names import heartbeat_path
from truestep.core.status import Phase, RankStatus
from truestep.resilience.heartbeat import Heartbeat, read_heartbeat
from truestep.supervisor.watch import OBSERVER_PAUSE_S, AttemptWatch, Failure, Rank

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


def beat(
    run_dir: Path,
    rank: Rank,
    step: int,
    step_s: Any = STEP_S,
    phase: Phase = Phase.TRAIN,
    at: float | None = None,
) -> None:
    """A heartbeat of `rank` at `step`, written now or dated `at` (in the past: a silent rank)."""
    path = heartbeat_path(run_dir, rank.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": rank.proc.pid,
        "rank": 0,
        "attempt": 0,
        "time": time.time() if at is None else at,
        "step": step,
        "phase": phase,
    }
    path.write_text(json.dumps({**record, "longest_step_s": step_s}))


def watch_of(run_dir: Path, rank: Rank, multiple: float) -> AttemptWatch:
    cfg = ResilienceConfig(hang_timeout_s=FLOOR_S, hang_step_multiple=multiple, liveness_timeout_s=30.0)
    return AttemptWatch(run_dir, [rank], cfg)


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


def test_the_allowance_grows_with_the_longest_reported_step(tmp_path: Path, rank: Rank) -> None:
    watch = watch_of(tmp_path, rank, 5.0)
    beat(tmp_path, rank, 0, step_s=0.0)  # before the first step: nothing reported
    assert watch.check() is None and watch.hang_allowance() == FLOOR_S
    for step, step_s in ((1, 0.1), (2, STEP_S), (3, 0.05)):
        beat(tmp_path, rank, step, step_s)
        assert watch.check() is None
    assert watch.longest_step_s == STEP_S and watch.hang_allowance() == 5.0 * STEP_S > FLOOR_S
    failure, stalled = stall_until_declared(watch, tmp_path, rank, 4)
    assert failure.kind == "no_progress" and stalled > 5.0 * STEP_S, (failure, stalled)
    assert "resilience.hang_step_multiple=5 x the longest step, 0.2s" in failure.detail, failure.detail
    assert watch.hang_allowance() == 5.0 * STEP_S  # the stalled step did not lengthen its own allowance


def test_multiple_zero_keeps_the_fixed_timeout(tmp_path: Path, rank: Rank) -> None:
    watch = watch_of(tmp_path, rank, 0.0)
    beat(tmp_path, rank, 1, step_s=10.0)
    assert watch.check() is None and watch.hang_allowance() == FLOOR_S
    failure, stalled = stall_until_declared(watch, tmp_path, rank, 2)
    assert stalled > FLOOR_S and failure.kind == "no_progress"
    assert "resilience.hang_timeout_s=0.3" in failure.detail, failure.detail


@pytest.mark.parametrize("step_s", ["1000", None, True, float("nan"), float("inf"), -5.0, [1]])
def test_a_malformed_step_duration_is_ignored(tmp_path: Path, rank: Rank, step_s: Any) -> None:
    """A heartbeat is a control file: a duration that is not a finite positive number changes nothing."""
    watch = watch_of(tmp_path, rank, 5.0)
    path = heartbeat_path(tmp_path, rank.rank)
    path.parent.mkdir(parents=True)
    record = {"pid": rank.proc.pid, "rank": 0, "attempt": 0, "time": time.time(), "step": 1, "phase": "train"}
    path.write_text(
        json.dumps({**record, "longest_step_s": step_s})
    )  # NaN and Infinity as Python's json writes them
    assert watch.check() is None
    assert watch.longest_step_s == 0.0 and watch.hang_allowance() == FLOOR_S


def test_a_forged_step_time_is_bounded_by_what_the_watcher_saw(tmp_path: Path, rank: Rank) -> None:
    """A heartbeat is a hint: a rank (or whoever writes its file) reporting steps of 1e300 s cannot turn
    hang detection off. The watcher takes at most the longest it saw the step stand still before it moved,
    plus one beat's lag; a stalled step is then declared as usual."""
    cfg = ResilienceConfig(
        hang_timeout_s=FLOOR_S, hang_step_multiple=1.0, liveness_timeout_s=30.0, heartbeat_interval_s=0.05
    )
    watch = AttemptWatch(tmp_path, [rank], cfg)
    beat(tmp_path, rank, 1, step_s=0.0)
    assert watch.check() is None
    beat(tmp_path, rank, 2, step_s=1e300)
    assert watch.check() is None
    lag = cfg.heartbeat_interval_s + OBSERVER_PAUSE_S
    assert lag <= watch.longest_step_s < lag + 0.5, watch.longest_step_s
    failure, stalled = stall_until_declared(watch, tmp_path, rank, 3)
    assert failure.kind == "no_progress" and stalled < 10.0, (failure, stalled)
    # A step the watcher did see take long is believed: step 3 stood still for 3 s (as if first seen then).
    watch.step_seen[0] = (3, time.time() - 3.0)
    beat(tmp_path, rank, 4, step_s=2.5)
    watch.check()
    assert watch.longest_step_s == 2.5


def test_a_restart_keeps_what_was_reported(tmp_path: Path, rank: Rank) -> None:
    cfg = ResilienceConfig(hang_timeout_s=FLOOR_S, hang_step_multiple=5.0)
    assert AttemptWatch(tmp_path, [rank], cfg, longest_step_s=2.0).hang_allowance() == 10.0


def test_the_heartbeat_carries_the_longest_step(tmp_path: Path) -> None:
    status = RankStatus()
    hb = Heartbeat(tmp_path, 0, 0, status, interval_s=0.05)
    hb.start()
    try:
        assert read_heartbeat(heartbeat_path(tmp_path, 0))["longest_step_s"] == 0.0
        status.longest_step_s, status.step, status.phase = 1.25, 1, Phase.TRAIN
        deadline = time.time() + 10
        while (read_heartbeat(heartbeat_path(tmp_path, 0)) or {}).get("step") != 1:
            assert time.time() < deadline, "no beat with step 1"
            time.sleep(0.02)
        assert read_heartbeat(heartbeat_path(tmp_path, 0))["longest_step_s"] == 1.25
    finally:
        hb.stop()


@pytest.mark.parametrize(
    ("phase", "declared"), [(Phase.LOADING, False), (Phase.STARTUP, True), (Phase.RESTORE, True)]
)
def test_a_loading_rank_may_be_silent_for_the_startup_timeout(
    tmp_path: Path, rank: Rank, phase: Phase, declared: bool
) -> None:
    """Silent for 2 s with liveness 1 s and startup 5 s: stale unless the rank is still importing torch
    (phase `loading`); silent for 6 s, stale in any phase."""
    cfg = ResilienceConfig(liveness_timeout_s=1.0, startup_timeout_s=5.0)
    watch = AttemptWatch(tmp_path, [rank], cfg)
    beat(tmp_path, rank, 0, phase=phase, at=time.time() - 2.0)
    failure = watch.check()
    assert (failure is not None) == declared, failure
    if declared:
        assert failure.kind == "stale_heartbeat" and "resilience.liveness_timeout_s=1" in failure.detail
    beat(tmp_path, rank, 0, phase=Phase.LOADING, at=time.time() - 6.0)
    failure = watch.check()
    assert failure is not None and failure.kind == "stale_heartbeat", failure
    assert "resilience.startup_timeout_s=5 while loading" in failure.detail, failure.detail


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_a_pause_of_the_watcher_is_not_the_ranks_silence(tmp_path: Path, rank: Rank) -> None:
    """The watcher sleeps through 3 x OBSERVER_PAUSE_S (a frozen machine) while the rank's last beat ages
    past the liveness timeout (1.5 x OBSERVER_PAUSE_S): only OBSERVER_PAUSE_S of the pause counts, so the
    rank is not declared at once, and is declared once it stays silent for the rest of its window."""
    liveness = 1.5 * OBSERVER_PAUSE_S
    watch = AttemptWatch(tmp_path, [rank], ResilienceConfig(liveness_timeout_s=liveness))
    beat(tmp_path, rank, 0, phase=Phase.TRAIN, at=time.time())
    assert watch.check() is None and watch.paused_s is None
    time.sleep(3 * OBSERVER_PAUSE_S)  # the beat is now twice as old as the liveness timeout
    assert watch.check() is None, "the watcher's own pause was counted against the rank"
    assert watch.paused_s is not None and watch.paused_s >= 3 * OBSERVER_PAUSE_S
    resumed = time.time()
    while (failure := watch.check()) is None:
        assert time.time() - resumed < 30, "a silent rank was never declared"
        time.sleep(0.05)
    assert failure.kind == "stale_heartbeat" and time.time() - resumed >= 0.4 * OBSERVER_PAUSE_S


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_a_slow_watcher_still_declares_a_silent_rank(tmp_path: Path, rank: Rank) -> None:
    """Every poll 1.2 x OBSERVER_PAUSE_S apart is a 'pause' each time; were a pause to restart the
    deadlines, a silent rank would never be declared. Only the excess is left out: it is, within a few polls."""
    watch = AttemptWatch(tmp_path, [rank], ResilienceConfig(liveness_timeout_s=1.5 * OBSERVER_PAUSE_S))
    beat(tmp_path, rank, 0, phase=Phase.TRAIN, at=time.time())
    assert watch.check() is None
    for _ in range(6):
        time.sleep(1.2 * OBSERVER_PAUSE_S)
        failure = watch.check()
        assert watch.paused_s is not None
        if failure is not None:
            break
    assert failure is not None and failure.kind == "stale_heartbeat", "a slow watcher never declared the rank"


def test_a_beat_from_the_future_does_not_hide_a_silent_rank(tmp_path: Path, rank: Rank) -> None:
    """A heartbeat is a control file: a `time` ahead of the clock counts as now, not as a beat to come."""
    watch = AttemptWatch(tmp_path, [rank], ResilienceConfig(liveness_timeout_s=0.3))
    beat(tmp_path, rank, 0, phase=Phase.TRAIN, at=time.time() + 3600)
    started = time.time()
    while (failure := watch.check()) is None:
        assert time.time() - started < 10, "a beat dated an hour ahead hid the rank's silence"
        time.sleep(0.05)
    assert failure.kind == "stale_heartbeat"


def test_leaving_loading_is_written_at_once(tmp_path: Path) -> None:
    """The rank's front door beats as it leaves `loading` (train/rank.py): a warm standby restores within
    one interval of its handoff, and a last beat still saying `loading` gave a rank stopped in its restore
    20 s (startup_timeout_s) instead of the liveness timeout. Here the thread would not beat for a minute."""
    status = RankStatus(phase=Phase.LOADING)
    hb = Heartbeat(tmp_path, 0, 0, status, interval_s=60.0)
    hb.start()
    try:
        assert read_heartbeat(heartbeat_path(tmp_path, 0))["phase"] == Phase.LOADING
        status.phase = Phase.STARTUP
        hb.beat_now()
        assert read_heartbeat(heartbeat_path(tmp_path, 0))["phase"] == Phase.STARTUP
    finally:
        hb.stop()
