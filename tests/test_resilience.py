"""Preemption, hard failures and hangs under the local supervisor, with real signals and process kills.

Every faulted job must end on a trajectory bitwise identical to the failure-free reference.
Detection latencies are asserted against the configured timeouts plus generous slack (noisy 2-core box).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import TINY, events, final_digest, launch, loss_bits_by_step, truestep_env
from supervised import (
    COMMON,
    HANG,
    HOLD_OVERRIDE,
    HOLD_STEP,
    LIVENESS,
    SLACK,
    assert_matches_reference,
    finish,
    hold,
    supervise,
    supervisor_events,
    wait_for_phase,
    wait_for_step,
    wait_until_held,
)

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def reference(supervised_reference: Path) -> Path:
    return supervised_reference


def test_sigterm_to_supervisor_saves_and_requeues(reference: Path, tmp_path: Path) -> None:
    proc = supervise(tmp_path, HOLD_OVERRIDE, faults=hold())
    wait_until_held(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert finish(proc) == 75, finish.last_output  # type: ignore[attr-defined]
    assert [e["signal"] for e in supervisor_events(tmp_path, "supervisor_signal")] == ["SIGTERM"]
    stop = events(tmp_path, "signal_received")[-1]
    # Rank 0 may learn of the stop from the agreement before its own SIGTERM is noted ("peer").
    assert (stop["signal"] in ("SIGTERM", "peer"), stop["stop_reason"]) == (True, "preempted"), stop
    assert stop["stop_step"] == HOLD_STEP, stop  # the first step boundary after the signal
    saved = {e["step"] for e in events(tmp_path, "checkpoint_commit")}
    assert stop["stop_step"] in saved, "the emergency checkpoint was not committed"
    assert supervisor_events(tmp_path, "supervisor_end")[-1]["outcome"] == "requeue"
    # The scheduler's requeue: launch again; it resumes from the emergency checkpoint.
    assert finish(supervise(tmp_path)) == 0
    assert events(tmp_path, "checkpoint_restore")[-1]["step"] == stop["stop_step"]
    assert_matches_reference(tmp_path, reference)


def test_signal_on_one_rank_is_agreed_and_restarted_locally(reference: Path, tmp_path: Path) -> None:
    proc = supervise(tmp_path, HOLD_OVERRIDE, faults=hold(rank=1))
    pid = wait_until_held(tmp_path, rank=1)
    os.kill(pid, signal.SIGUSR1)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    stop = events(tmp_path, "signal_received")[0]
    # Rank 0 never got the signal itself: it stopped because the ranks agreed.
    assert stop["signal"] == "peer" and stop["stop_step"] == HOLD_STEP, stop
    assert supervisor_events(tmp_path, "restart")[0]["after"] == "requeue"
    assert events(tmp_path, "checkpoint_restore")[0]["step"] == stop["stop_step"]
    assert_matches_reference(tmp_path, reference)


def test_sigkill_of_a_rank_is_detected_within_seconds(reference: Path, tmp_path: Path) -> None:
    proc = supervise(tmp_path, HOLD_OVERRIDE, faults=hold(rank=1))
    pid = wait_until_held(tmp_path, rank=1)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    failure = supervisor_events(tmp_path, "failure_detected")[0]
    assert failure["kind"] == "process_exit"
    assert failure["detected_at"] - killed_at < 2.0 + SLACK
    assert supervisor_events(tmp_path, "teardown_complete")[0]["teardown_s"] < 10
    assert_matches_reference(tmp_path, reference)


def test_sigstop_hang_is_detected_by_the_heartbeat(reference: Path, tmp_path: Path) -> None:
    proc = supervise(tmp_path, HOLD_OVERRIDE, faults=hold(rank=1))
    pid = wait_until_held(tmp_path, rank=1)
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    failure = supervisor_events(tmp_path, "failure_detected")[0]
    # The heartbeat goes stale and /proc says stopped: whichever rule sees it first, within the timeout.
    assert failure["kind"] in ("stale_heartbeat", "process_stopped") and failure["rank"] == 1
    latency = failure["detected_at"] - stopped_at
    assert LIVENESS - 0.5 < latency < LIVENESS + SLACK, latency
    assert_matches_reference(tmp_path, reference)


def test_kill_during_commit_resumes_from_the_previous_complete_checkpoint(
    reference: Path, tmp_path: Path
) -> None:
    proc = supervise(tmp_path, faults="crash:at=save:before-marker:step=10:rank=0")
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    quarantined = events(tmp_path, "checkpoint_quarantined")
    assert [q["step"] for q in quarantined] == [10]
    assert events(tmp_path, "checkpoint_restore")[0]["step"] == 5
    assert_matches_reference(tmp_path, reference)


def test_corrupt_waits_for_a_commit_under_way(reference: Path, tmp_path: Path) -> None:
    """`corrupt` damages the checkpoint a restart would resume from, also while rank 0's background
    commit is under way: rank 0 pauses before step 12 so step 10's async write is done at the step-12
    boundary, its commit is held 1.5 s before the marker, and the fault fires as step 13 starts. It
    waits for that commit and damages step 10, which the restart quarantines, resuming from step 5. It
    once picked step 5 while step 10's marker was being written: nothing was quarantined (CI); here that
    would also strand the job (step 10 torn by the kill, step 5 damaged)."""
    faults = (
        "sleep:at=train:step:step=12:rank=0:seconds=2;"
        "sleep:at=save:before-marker:step=10:rank=0:seconds=1.5;corrupt:step=13"
    )
    proc = supervise(tmp_path, faults=faults)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    assert [q["step"] for q in events(tmp_path, "checkpoint_quarantined")] == [10]
    assert events(tmp_path, "checkpoint_restore")[0]["step"] == 5
    assert_matches_reference(tmp_path, reference)


def test_slow_checkpoint_and_slow_first_step_are_not_hangs(reference: Path, tmp_path: Path) -> None:
    slow = HANG + 2
    faults = (
        f"sleep:at=train:step:step=1:seconds={slow};sleep:at=save:after-shards:step=10:rank=1:seconds={slow}"
    )
    proc = supervise(tmp_path, faults=faults)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    assert supervisor_events(tmp_path, "failure_detected") == []
    assert supervisor_events(tmp_path, "supervisor_end")[-1]["restarts"] == 0
    assert_matches_reference(tmp_path, reference)


def test_a_stalled_training_step_is_declared_hung(tmp_path: Path) -> None:
    proc = supervise(tmp_path, restarts=0, faults=f"sleep:at=train:step:step=12:rank=0:seconds={HANG + 30}")
    assert finish(proc) == 1
    failure = supervisor_events(tmp_path, "failure_detected")[0]
    assert failure["kind"] == "no_progress"


# A job whose steps outgrow hang_timeout_s (1 s here): the first step takes 2 s (warm-up, say), step 6
# 1.5 s. With the steps' own allowance (5 x the longest reported, >= 10 s) it is not a hang; with the
# fixed timeout alone it is.
SLOW_STEPS = "sleep:at=train:step:step=1:seconds=2;sleep:at=train:step:step=6:seconds=1.5"


def test_steps_longer_than_hang_timeout_are_not_hangs(reference: Path, tmp_path: Path) -> None:
    proc = supervise(tmp_path, "--resilience.hang_timeout_s=1", restarts=0, faults=SLOW_STEPS)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    assert supervisor_events(tmp_path, "failure_detected") == []
    assert_matches_reference(tmp_path, reference)


def test_without_the_step_multiple_a_long_step_is_declared_hung(tmp_path: Path) -> None:
    overrides = ("--resilience.hang_timeout_s=1", "--resilience.hang_step_multiple=0")
    proc = supervise(tmp_path, *overrides, restarts=0, faults=SLOW_STEPS)
    assert finish(proc) == 1, finish.last_output  # type: ignore[attr-defined]
    failure = supervisor_events(tmp_path, "failure_detected")[0]
    assert failure["kind"] == "no_progress" and "resilience.hang_timeout_s=1" in failure["detail"], failure


def test_forced_exit_deadline_when_graceful_stop_stalls(tmp_path: Path) -> None:
    env = truestep_env({"TRUESTEP_FAULTS": "sleep:at=train:step:step=6:seconds=60"})
    cmd = [sys.executable, "-m", "truestep", "train", "tiny", f"--run.dir={tmp_path}", *TINY, *COMMON]
    cmd += ["--resilience.exit_deadline_s=2", "--allow-env-faults"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_step(tmp_path, 0, 5)
    time.sleep(0.5)  # now inside the stalled step 6
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, timeout=60) == 76
    assert time.time() - sent < 2 + SLACK


def test_nan_steps_are_skipped_then_rolled_back(tmp_path: Path) -> None:
    """Two poisoned steps in a row trigger a rollback to step 10; replayed clean, the run ends on the
    exact failure-free trajectory of a single process."""
    ref = tmp_path / "ref"
    launch(ref, *COMMON)
    run = tmp_path / "run"
    faults = "nan:at=train:loss:step=12;nan:at=train:loss:step=13"
    launch(run, *COMMON, "--resilience.nan_rollback_after=2", env={"TRUESTEP_FAULTS": faults})
    skipped = events(run, "nonfinite_step_skipped")
    assert [s["step"] for s in skipped] == [12, 13]
    assert events(run, "nan_rollback")[0]["to_step"] == 10
    assert loss_bits_by_step(run) == loss_bits_by_step(ref)
    assert final_digest(run) == final_digest(ref)


def test_sigterm_during_a_checkpoint_write(reference: Path, tmp_path: Path) -> None:
    """The preemption lands while rank 0 is still finishing the step-10 save: that save completes,
    the ranks agree on a stop step, and the emergency checkpoint resumes bitwise."""
    proc = supervise(tmp_path, faults="sleep:at=save:after-shards:step=10:rank=0:seconds=3")
    wait_for_phase(tmp_path, 0, "checkpoint", 10)
    proc.send_signal(signal.SIGTERM)
    assert finish(proc) == 75, finish.last_output  # type: ignore[attr-defined]
    stop = events(tmp_path, "signal_received")[-1]["stop_step"]
    committed = {e["step"] for e in events(tmp_path, "checkpoint_commit")}
    assert {10, stop} <= committed
    assert finish(supervise(tmp_path)) == 0
    assert events(tmp_path, "checkpoint_restore")[-1]["step"] == stop
    assert_matches_reference(tmp_path, reference)
