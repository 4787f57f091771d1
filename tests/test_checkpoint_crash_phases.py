"""Commit protocol under crashes: the reference run, and a SIGKILL at every phase of the step-6 save
resuming from the newest complete checkpoint, bitwise. Shared runs: tests/conftest.py, helpers: tests/ckpt_cases.py.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import harness
from ckpt_cases import (
    COMMITTED_FILES,
    CRASH_CASES,
    FILES_AT_CRASH,
    RACING_AT_CRASH,
    CrashCase,
    assert_same_trajectory,
    attempt_events,
    ckpt,
    last_attempt,
    live_steps,
    quarantined,
    step_dir_name,
)
from truestep.checkpoint.integrity import verify

pytestmark = pytest.mark.multiprocess

# ----------------------------------------------------------------------------------------------
# crash at every phase of the save at step 6


def test_reference_run_is_complete(reference):
    assert live_steps(reference) == [10, 9, 6, 3]
    assert quarantined(reference) == []
    for step in (3, 6, 9, 10):
        verify(ckpt(reference, step), checksums=True)
    assert [e["step"] for e in harness.events(reference, "checkpoint_commit")] == [3, 6, 9, 10]


@pytest.mark.parametrize(("point", "mode"), CRASH_CASES, ids=[f"{p}-{m}" for p, m in CRASH_CASES])
def test_crash_during_save_resumes_from_newest_complete(point, mode, independent_runs, reference):
    case: CrashCase = independent_runs[f"crash/{point}/{mode}"].result()
    run = case.run
    # The crashed attempt was SIGKILLed at exactly this point of the step-6 save.
    assert case.crashed.returncode == -signal.SIGKILL, case.crashed.stderr[-3000:]
    assert f"truestep fault: crash at {point} step=6 rank=0" in case.crashed.stderr
    racing = RACING_AT_CRASH.get((point, mode), set())
    at_crash = {
        step: [f for f in files if step != 6 or f not in racing]
        for step, files in case.files_after_crash.items()
    }
    assert at_crash == {6: FILES_AT_CRASH[point], 3: COMMITTED_FILES}
    assert attempt_events(run, "run_end", 0) == []
    assert [e["step"] for e in attempt_events(run, "checkpoint_commit", 0)] == [3]

    assert case.resumed.returncode == 0, case.resumed.stderr[-3000:]
    assert last_attempt(run) == 1
    complete = 6 if point == "save:after-marker" else 3
    restores = attempt_events(run, "checkpoint_restore", 1)
    assert [(e["step"], Path(e["path"]).name) for e in restores] == [(complete, step_dir_name(complete))]
    events = attempt_events(run, "checkpoint_quarantined", 1)
    if complete == 3:
        # The torn directory was moved aside, unchanged, with the reason in the event log.
        assert [(e["step"], e["reason"]) for e in events] == [(6, "missing COMMITTED")]
        (moved,) = quarantined(run)
        assert moved.name.startswith("step_00000006.") and moved.name.endswith(".missing-committed")
        assert events[0]["moved_to"] == str(moved)
        assert sorted(f.name for f in moved.iterdir()) == case.files_after_crash[6]
    else:
        assert events == [] and quarantined(run) == []
    assert live_steps(run) == [10, 9, 6]  # keep_last_n=3 (default) retired step 3
    for step in (6, 9, 10):
        verify(ckpt(run, step), checksums=True)
    assert_same_trajectory(run, reference, attempt=1, first_step=complete + 1)
