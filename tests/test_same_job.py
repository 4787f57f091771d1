"""A job is not its id alone (issue 27, item 2): a second launch with the same job id into a live run
directory is refused (exit 4) unless it is provably the job's next launch (a newer generation / SLURM
restart count), and the first launch trains on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import truestep_env
from supervised import finish, launch_cmd, one_line, supervise, supervisor_events, wait_for_event
from truestep.core.errors import RunDirBusyError
from truestep.core.names import LEASE_FILE
from truestep.resilience.lease import RunDirLease, process_start_ticks, read_lease


@pytest.fixture
def live_holder(tmp_path: Path) -> Iterator[subprocess.Popen]:
    """A lease held by another live process of job `J`, launch generation 3."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        RunDirLease(tmp_path, "J", ttl_s=30.0, generation="3").acquire()
        record = json.loads((tmp_path / LEASE_FILE).read_text())
        record.update(pid=proc.pid, pid_start=process_start_ticks(proc.pid))
        (tmp_path / LEASE_FILE).write_text(json.dumps(record))
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("generation", ["3", "2", "x", "0"])
def test_the_same_job_id_without_a_newer_generation_is_refused(
    tmp_path: Path, live_holder: subprocess.Popen, generation: str
) -> None:
    with pytest.raises(RunDirBusyError, match="same job id") as err:
        RunDirLease(tmp_path, "J", ttl_s=30.0, generation=generation).acquire()
    assert f"pid {live_holder.pid}" in str(err.value) and "\n" not in str(err.value)
    assert read_lease(tmp_path).pid == live_holder.pid  # the first launch keeps its lease


def test_the_jobs_next_launch_takes_over(tmp_path: Path, live_holder: subprocess.Popen) -> None:
    previous = RunDirLease(tmp_path, "J", ttl_s=30.0, generation="4").acquire()
    assert previous is not None and previous.pid == live_holder.pid
    assert read_lease(tmp_path).pid == os.getpid()


def test_another_job_is_still_refused_and_a_dead_holder_still_yields(
    tmp_path: Path, live_holder: subprocess.Popen
) -> None:
    with pytest.raises(RunDirBusyError):
        RunDirLease(tmp_path, "K", ttl_s=30.0, generation="9").acquire()
    live_holder.kill()
    live_holder.wait()
    assert RunDirLease(tmp_path, "J", ttl_s=30.0, generation="3").acquire() is not None


@pytest.mark.multiprocess
def test_a_second_launch_with_the_same_job_id_is_refused_and_the_first_trains_on(tmp_path: Path) -> None:
    same = {"TRUESTEP_JOB_ID": "one-allocation"}
    timeouts = ("--resilience.liveness_timeout_s=120", "--resilience.hang_timeout_s=120")
    proc = supervise(tmp_path, *timeouts, faults="hang:rank=0:step=6", env=same)
    stopped = wait_for_event(tmp_path, "fault_injected")
    second = subprocess.run(launch_cmd(tmp_path), env=truestep_env(same), capture_output=True, text=True)
    assert second.returncode == 4, second.stderr
    assert "same job id" in one_line(second.stderr) and f"pid {proc.pid}" in one_line(second.stderr)
    assert stopped["rank"] == 0
    os.kill(next(e["pids"][0] for e in supervisor_events(tmp_path, "attempt_start")), signal.SIGCONT)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    assert supervisor_events(tmp_path, "lease_taken_over") == []
