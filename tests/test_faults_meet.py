"""Two faults that meet: a fault during the recovery of the previous one, and a preemption notice during
a recovery, under the real supervisor with real kills and signals. Each must end bitwise equal to the
failure-free reference and none may strand the job.

A preemption notice is honoured from a rank's first instant (resilience/early_signals.py): the
supervisor starts ranks and warm standbys with the preemption signals blocked, so a notice sent before
a rank installed its handlers waits for them instead of killing it with the default action. Those two
tests signal a process microseconds after it was started, through the supervisor's own pool.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from harness import events, truestep_env
from supervised import (
    assert_matches_reference,
    finish,
    supervise,
    supervisor_events,
)
from truestep.config.load import load_config, to_toml
from truestep.core.launch import Launch
from truestep.supervisor.standby import StandbyPool
from truestep.telemetry.jsonl import JsonlWriter

pytestmark = pytest.mark.multiprocess

FAULT_STEP = 12  # attempt 0 fails here, after the saves of steps 5 and 10 (interval 5)


@pytest.fixture
def reference(supervised_reference: Path) -> Path:
    return supervised_reference


def attempts(run: Path) -> list[int]:
    return [e["attempt"] for e in supervisor_events(run, "attempt_start")]


def resumed_where_attempt_0_committed(run: Path) -> bool:
    """A restart resumes from attempt 0's newest committed save: step 10 if its async save committed
    before the kill, else 5. At least the newest whose checkpoint_commit attempt 0 logged: rank 0 torn
    down between writing the marker and logging the event leaves step 10 committed without the event
    (CI: restored 10, the events said 5). Later attempts commit 10 again, so the disk cannot say it."""
    logged = max(e["step"] for e in events(run, "checkpoint_commit") if e["attempt"] == 0)
    restored = events(run, "checkpoint_restore")[-1]["step"]
    return restored in (5, 10) and restored >= logged


def wait_for_events(run: Path, name: str, count: int, timeout: float = 400) -> list[dict]:
    """The supervisor's first `count` events `name` (a line being written is read again next time)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            found = supervisor_events(run, name)
        except (OSError, ValueError):  # not written yet, or a line half written
            found = []
        if len(found) >= count:
            return found[:count]
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} {name} events in {run} after {timeout}s")


def fired(run: Path) -> list[tuple[str, int]]:
    return [(e["point"], e["attempt"]) for e in events(run, "fault_injected")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("second", "point"),
    [("kill:at=restore:rank=0:restart=1", "restore"), ("kill:at=rendezvous:rank=1:restart=1", "rendezvous")],
)
def test_a_fault_during_the_recovery_of_the_previous_one(
    second: str, point: str, reference: Path, tmp_path: Path
) -> None:
    """Rank 1 killed at step 12; while attempt 1 restores (or rendezvouses) a rank of it is killed too."""
    proc = supervise(tmp_path, faults=f"kill:rank=1:step={FAULT_STEP};{second}", restarts=3)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    assert fired(tmp_path) == [("train:step", 0), (point, 1)]
    assert attempts(tmp_path) == [0, 1, 2]
    assert [e["attempt"] for e in supervisor_events(tmp_path, "failure_detected")] == [0, 1]
    assert resumed_where_attempt_0_committed(tmp_path), events(tmp_path, "checkpoint_restore")
    assert_matches_reference(tmp_path, reference)


@pytest.mark.slow
def test_a_preemption_notice_during_a_teardown_requeues_without_a_new_attempt(
    reference: Path, tmp_path: Path
) -> None:
    """The notice reaches the supervisor while it kills the ranks of a failed attempt: it must not start
    another attempt only to save the commit it would restore, but stop with 75 for the requeue; the
    relaunch resumes from the newest commit."""
    proc = supervise(tmp_path, faults=f"kill:rank=1:step={FAULT_STEP};term:at=teardown", restarts=3)
    assert finish(proc) == 75, finish.last_output  # type: ignore[attr-defined]
    assert fired(tmp_path) == [("train:step", 0), ("teardown", 0)]
    assert attempts(tmp_path) == [0]
    [end] = supervisor_events(tmp_path, "supervisor_end")
    assert (end["outcome"], end["exit_code"]) == ("requeue", 75)
    assert finish(supervise(tmp_path, env={"TRUESTEP_JOB_GENERATION": "1"})) == 0  # the requeue
    assert resumed_where_attempt_0_committed(tmp_path), events(tmp_path, "checkpoint_restore")
    assert_matches_reference(tmp_path, reference)


@pytest.mark.slow
def test_a_preemption_notice_during_a_restore_is_honoured(reference: Path, tmp_path: Path) -> None:
    """Rank 1 killed at step 12; as attempt 1's rank 0 restores, the notice reaches the supervisor, which
    forwards it to ranks still restoring or starting: they finish the restore and stop before their first
    step (the restored checkpoint is the newest commit: nothing to save) with exit 75, or, if the notice
    reached them after that, agree at their first step boundary and commit an emergency checkpoint; the
    requeue resumes from the stop step, bitwise."""
    proc = supervise(tmp_path, faults=f"kill:rank=1:step={FAULT_STEP};term:at=restore:rank=0:restart=1")
    assert finish(proc) == 75, finish.last_output  # type: ignore[attr-defined]
    assert fired(tmp_path) == [("train:step", 0), ("restore", 1)]
    assert attempts(tmp_path) == [0, 1]
    [stop] = events(tmp_path, "signal_received")
    assert (stop["attempt"], stop["stop_reason"]) == (1, "preempted"), stop
    assert stop["stop_step"] in {
        e["step"] for e in events(tmp_path, "checkpoint_commit")
    }  # saved, now or before
    codes = supervisor_events(tmp_path, "supervisor_end")[-1]
    assert (codes["outcome"], codes["exit_code"]) == ("requeue", 75)
    assert finish(supervise(tmp_path, env={"TRUESTEP_JOB_GENERATION": "1"})) == 0  # the requeue
    assert events(tmp_path, "checkpoint_restore")[-1]["step"] == stop["stop_step"]
    assert_matches_reference(tmp_path, reference)


@pytest.mark.slow
def test_a_fault_during_the_standby_handoff(reference: Path, tmp_path: Path) -> None:
    """Attempt 0 stalls at step 12, then rank 1 is killed; the process the warm template forked for rank 0
    of attempt 1 is killed as it becomes the rank. Attempt 2 (forked again) finishes bitwise."""
    stall = f"sleep:at=train:step:step={FAULT_STEP}:rank=0:seconds=300"
    proc = supervise(
        tmp_path,
        "--resilience.warm_standby=true",
        "--resilience.hang_timeout_s=300",
        "--resilience.collective_timeout_s=300",
        faults=f"{stall};kill:at=handoff:rank=0:restart=1",
        restarts=3,
    )
    try:
        wait_for_events(tmp_path, "standby_ready", 1)
        deadline = time.time() + 300
        while not fired(tmp_path) and time.time() < deadline:  # rank 0 stalls at step 12
            time.sleep(0.2)
        [start] = supervisor_events(tmp_path, "attempt_start")
        os.kill(start["pids"][1], signal.SIGKILL)
    except BaseException:
        proc.kill()  # its ranks die with it
        raise
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    assert fired(tmp_path) == [("train:step", 0), ("handoff", 1)]  # the stall, then the handoff kill
    assert {e["rank"] for e in supervisor_events(tmp_path, "standby_handoff")} >= {0}
    assert attempts(tmp_path) == [0, 1, 2]
    assert_matches_reference(tmp_path, reference)


# ------------------------------------------------------------------ a notice from the first instant


def _rank_config(tmp_path: Path) -> Path:
    config = tmp_path / "config.toml"
    overrides = [f"--run.dir={tmp_path / 'run'}", "--train.max_steps=20", "--metrics.progress=false"]
    config.write_text(to_toml(load_config("tiny", overrides)))
    return config


def _preempted_at_its_first_step(run: Path) -> None:
    """Stopped before its first step (issue 41: promptly, nothing trained so nothing to save), not killed."""
    [received] = events(run, "signal_received")
    assert (received["signal"], received["stop_reason"]) == ("SIGTERM", "preempted"), received
    assert received["during_startup"] and received["stop_step"] == 0, received
    assert not events(run, "checkpoint_commit")
    assert not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text()


def test_a_notice_sent_as_a_rank_starts_is_honoured(tmp_path: Path) -> None:
    """SIGTERM to a rank the supervisor's pool has just started, before its interpreter even runs: it
    must be handled (a stop before the first step, exit 75), not kill the rank with the default action
    (-15)."""
    pool = StandbyPool(tmp_path, JsonlWriter(tmp_path / "events.jsonl"), enabled=False, heartbeats=False)
    rank = pool.launch(0, Launch(config_file=str(_rank_config(tmp_path))), truestep_env())
    os.kill(rank.pid, signal.SIGTERM)
    assert rank.wait(timeout=180) == 75
    _preempted_at_its_first_step(tmp_path / "run")


def test_a_notice_to_the_template_is_nobodys_and_one_to_a_forked_rank_is_honoured(tmp_path: Path) -> None:
    """SIGTERM to the warm template as it starts (it is importing torch): it is not a rank, so the notice
    must neither kill it nor reach the ranks it forks (a fork does not inherit pending signals). SIGTERM to
    a rank it has just forked, before the rank installed its handlers: honoured (exit 75), not a death by
    the default action (-15)."""
    config = _rank_config(tmp_path)
    base = truestep_env()
    pool = StandbyPool(tmp_path, JsonlWriter(tmp_path / "events.jsonl"), enabled=True, heartbeats=False)
    try:
        rank = pool.launch(0, Launch(config_file=str(config)), base)  # spawns the template, then forks
        template = pool.standby
        assert template is not None and rank.pid != template.proc.pid
        os.kill(template.proc.pid, signal.SIGTERM)
        os.kill(rank.pid, signal.SIGTERM)
        assert rank.wait(timeout=180) == 75
        _preempted_at_its_first_step(tmp_path / "run")
        time.sleep(0.5)
        assert template.proc.poll() is None, (
            f"the template died of the notice (exit {template.proc.returncode})"
        )
    finally:
        pool.close()
