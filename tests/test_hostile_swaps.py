"""The run directory changed under a live run ends like the same state at start: refused, exit 3, one
line -- not exit 1, which a scheduler requeues forever. heartbeats/ swapped for a symlink to elsewhere or
for a file during an attempt: the supervisor refuses the next attempt (its run directory check runs
before every attempt, not only the first), a rank's heartbeat never writes through the link (the beat is
missed instead), and a rank that meets it at start refuses with exit 3 too. In-process: the real restart
loop and lease, with rank processes replaced by `sleep`."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from truestep.config.load import load_config
from truestep.core.errors import ExitCode, RefusedError, UnsafePathError, expected_failure
from truestep.core.status import RankStatus
from truestep.resilience.heartbeat import Heartbeat
from truestep.supervisor.driver import ProcessDriver
from truestep.supervisor.restart_loop import LaunchSpec, run_supervisor
from truestep.supervisor.standby import StandbyPool
from truestep.supervisor.watch import AttemptEnd, Failure, Outcome
from truestep.telemetry.jsonl import read_jsonl


def _swap(run: Path, how: str, outside: Path) -> None:
    beats = run / "heartbeats"
    shutil.rmtree(beats, ignore_errors=True)
    if how == "symlink":
        outside.mkdir(exist_ok=True)
        (outside / "rank00000.json").write_text("{}")
        beats.symlink_to(outside)
    else:
        beats.write_text("not a directory")


@pytest.mark.parametrize("how", ["symlink", "file"])
def test_heartbeats_swapped_during_an_attempt_refuse_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    run, outside = tmp_path / "run", tmp_path / "elsewhere"
    cfg = load_config("tiny", [f"--run.dir={run}"])
    monkeypatch.setattr("signal.signal", lambda *args: None)  # the supervisor's handlers: not here
    monkeypatch.setattr(
        StandbyPool, "launch", lambda self, slot, launch, env: subprocess.Popen(["sleep", "30"])
    )
    ends = iter(
        [AttemptEnd(Outcome.FAILED, Failure("stale_heartbeat", 0, "silent")), AttemptEnd(Outcome.CLEAN)]
    )

    class SwapWhileRunning(ProcessDriver):
        """Real spawns (the directory checks of every attempt), scripted ends."""

        def watch(self, ranks: list) -> AttemptEnd:
            if self.sup.attempt == 0:
                _swap(run, how, outside)  # while the first attempt runs
            return next(ends)

    with pytest.raises(RefusedError) as caught:
        run_supervisor(LaunchSpec(nproc=1, max_restarts=3, job_id="job"), cfg, SwapWhileRunning)
    code, line = expected_failure(caught.value) or (None, "")
    assert code == ExitCode.REFUSED and "\n" not in line and f"{run / 'heartbeats'} is" in line, line
    [end] = [e for e in read_jsonl(run / "events.jsonl") if e.get("event") == "supervisor_end"]
    assert end["exit_code"] == ExitCode.REFUSED
    if how == "symlink":  # nothing outside the run directory was touched
        assert [p.name for p in outside.iterdir()] == ["rank00000.json"]
        assert (outside / "rank00000.json").read_text() == "{}"


def test_a_heartbeat_never_writes_through_a_swapped_directory(tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "elsewhere"
    beat = Heartbeat(run, 0, 0, RankStatus(), interval_s=0.02)
    beat.start()
    try:
        _swap(run, "symlink", outside)
        time.sleep(0.3)  # a dozen beats are due
        assert [p.name for p in outside.iterdir()] == ["rank00000.json"], "a beat was written outside"
        assert (outside / "rank00000.json").read_text() == "{}"
        assert beat._thread is not None and beat._thread.is_alive()  # beats missed, the thread lives on
    finally:
        beat.stop()


def test_a_rank_meeting_a_swapped_heartbeats_directory_refuses_with_exit_3(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "heartbeats").write_text("not a directory")
    with pytest.raises(UnsafePathError) as caught:
        Heartbeat(run, 0, 0, RankStatus(), interval_s=0.05).start()
    assert expected_failure(caught.value) == (
        ExitCode.REFUSED,
        f"refused: refusing a directory that is not a directory: {run / 'heartbeats'}",
    )
    os.unlink(run / "heartbeats")
