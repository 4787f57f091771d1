"""The supervisor's watch sees a rank from outside its interpreter too (supervisor/outside.py,
/proc/PID/stat): a SIGSTOPped rank is declared within the liveness timeout in every phase -- also while
it imports torch or before its first heartbeat, where the heartbeat rules alone gave it the 20 s start-up
allowance (19.2-19.7 s measured) --, a silent rank asleep with no CPU progress likewise, and time a rank
spent waiting for a CPU is not held against its start-up. The watch runs in-process on real processes
and real heartbeat files; only the starvation case feeds /proc samples (a starved CPU cannot be made to
order). Only bounds the rule guarantees are asserted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from truestep.config.schema import ResilienceConfig
from truestep.core.names import heartbeat_path
from truestep.core.status import Phase
from truestep.supervisor import outside
from truestep.supervisor.watch import AttemptWatch, Failure, Rank

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc: heartbeats only")

LIVENESS_S, STARTUP_S = 0.5, 20.0
CFG = ResilienceConfig(liveness_timeout_s=LIVENESS_S, startup_timeout_s=STARTUP_S)


def spawn(script: str) -> Rank:
    return Rank(0, subprocess.Popen([sys.executable, "-c", script]), time.time())


@pytest.fixture
def busy() -> Iterator[Rank]:
    """A process at work (a rank importing torch: it holds the GIL, its heartbeat cannot beat)."""
    rank = spawn("while True: pass")
    try:
        yield rank
    finally:
        rank.proc.kill()
        rank.proc.wait()


@pytest.fixture
def asleep() -> Iterator[Rank]:
    rank = spawn("import time; time.sleep(120)")
    try:
        yield rank
    finally:
        rank.proc.kill()
        rank.proc.wait()


def beat(run_dir: Path, rank: Rank, phase: Phase) -> None:
    path = heartbeat_path(run_dir, rank.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"pid": rank.proc.pid, "rank": 0, "attempt": 0, "time": time.time(), "step": 0, "phase": phase}
    path.write_text(json.dumps(record))


def watch_until_declared(watch: AttemptWatch, within_s: float) -> tuple[Failure, float]:
    started = time.time()
    while time.time() - started < within_s:
        failure = watch.check()
        if failure is not None:
            return failure, time.time() - started
        time.sleep(0.05)
    raise AssertionError(f"not declared within {within_s} s")


@pytest.mark.parametrize("phase", [None, Phase.LOADING, Phase.TRAIN])
def test_a_stopped_rank_is_declared_within_the_liveness_timeout_in_every_phase(
    tmp_path: Path, busy: Rank, phase: Phase | None
) -> None:
    """Stopped before its first beat (phase None), while importing torch, while training: declared as
    stopped, from when it was seen stopped, in about liveness_timeout_s -- not startup_timeout_s."""
    if phase is not None:
        beat(tmp_path, busy, phase)
    watch = AttemptWatch(tmp_path, [busy], CFG)
    assert watch.check() is None
    os.kill(busy.proc.pid, signal.SIGSTOP)
    stopped_at = time.time()
    failure, took = watch_until_declared(watch, STARTUP_S / 2)
    if phase == Phase.TRAIN and failure.kind == "stale_heartbeat":
        return  # the heartbeat rule saw it first: as fast, and right too
    assert failure.kind == "process_stopped" and failure.rank == 0, failure
    assert "state T" in failure.detail and "resilience.liveness_timeout_s=0.5" in failure.detail
    assert took >= LIVENESS_S and failure.last_seen is not None and failure.last_seen >= stopped_at


@pytest.mark.slow  # over ~1.5 s here: the whole suite, not the fast tier
def test_a_busy_silent_rank_keeps_its_loading_allowance(tmp_path: Path, busy: Rank) -> None:
    """Working without a beat (the import holds the GIL) is what the start-up allowance is for."""
    beat(tmp_path, busy, Phase.LOADING)
    watch = AttemptWatch(tmp_path, [busy], CFG)
    deadline = time.time() + 3 * LIVENESS_S
    while time.time() < deadline:
        assert watch.check() is None
        time.sleep(0.05)


@pytest.mark.parametrize("phase", [None, Phase.LOADING])
def test_a_silent_rank_asleep_with_no_cpu_progress_is_stuck(
    tmp_path: Path, asleep: Rank, phase: Phase | None
) -> None:
    if phase is not None:
        beat(tmp_path, asleep, phase)
    watch = AttemptWatch(tmp_path, [asleep], CFG)
    failure, took = watch_until_declared(watch, STARTUP_S / 2)
    assert failure.kind == "no_cpu_progress" and "no CPU time" in failure.detail, failure
    assert took >= LIVENESS_S


@pytest.mark.slow  # over ~1.5 s here: the whole suite, not the fast tier
def test_off_the_heartbeat_rules_stand_alone(tmp_path: Path, busy: Rank) -> None:
    """resilience.process_watch=false: a stopped loading rank gets its start-up allowance again."""
    beat(tmp_path, busy, Phase.LOADING)
    cfg = ResilienceConfig(liveness_timeout_s=LIVENESS_S, startup_timeout_s=STARTUP_S, process_watch=False)
    watch = AttemptWatch(tmp_path, [busy], cfg)
    os.kill(busy.proc.pid, signal.SIGSTOP)
    deadline = time.time() + 3 * LIVENESS_S
    while time.time() < deadline:
        assert watch.check() is None
        time.sleep(0.05)


@pytest.mark.slow  # over ~1.5 s here: the whole suite, not the fast tier
def test_time_spent_waiting_for_a_cpu_does_not_count_against_start_up(
    tmp_path: Path, asleep: Rank, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runnable all along (state R) but given a tenth of a CPU (an overloaded machine, a standby still
    importing when handed its rank): not declared after startup_timeout_s of wall clock; given the whole
    CPU and still silent, it is."""
    share = {"cpu": 0.1}
    clock = {"cpu_s": 0.0, "at": time.time()}

    def fake(pid: int) -> outside.ProcSample:
        now = time.time()
        clock["cpu_s"] += (now - clock["at"]) * share["cpu"]
        clock["at"] = now
        return outside.ProcSample("R", clock["cpu_s"])

    monkeypatch.setattr(outside, "sample", fake)
    cfg = ResilienceConfig(liveness_timeout_s=LIVENESS_S, startup_timeout_s=0.5)
    watch = AttemptWatch(tmp_path, [asleep], cfg)
    deadline = time.time() + 1.5  # three times the start-up timeout, at a tenth of a CPU
    while time.time() < deadline:
        assert watch.check() is None, "time the rank waited for a CPU was held against it"
        time.sleep(0.05)
    share["cpu"] = 1.0
    failure, _ = watch_until_declared(watch, 10.0)
    assert failure.kind == "startup_timeout"
