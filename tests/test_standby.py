"""Warm standby ranks (supervisor/standby.py, supervisor/handoff.py) under the real supervisor.

A restart handed to standbys must be the run that would have happened without the failure, bit for
bit, in every layout; the processes must be indistinguishable from fresh ranks where the trajectory or
the recovery path could see it (signal dispositions, parent, session); and a standby must never outlive
its supervisor or its job. The pool's decisions (which standby fits, what a lost one means) are checked
on real processes too, without a job.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import LAYOUT_REFERENCE, LAYOUT_STEPS, LAYOUTS, events, truestep_env
from supervised import (
    alive,
    assert_matches_reference,
    beat,
    finish,
    supervise,
    supervisor_events,
)
from truestep.config.load import load_config, to_toml
from truestep.core.launch import Launch
from truestep.supervisor.handoff import PER_ATTEMPT_ENV, adopted_env, env_differences, parked_env
from truestep.supervisor.standby import Standby, StandbyPool
from truestep.telemetry.jsonl import JsonlWriter, read_jsonl

pytestmark = pytest.mark.multiprocess

STALL_AT, CHECK_AT = 6, 7
# The trajectory of the per-layout references (conftest.py). Attempt 0 stalls rank 0 before step
# STALL_AT (long enough for every standby to import torch); the test kills the last rank there.
# Attempt 1 pauses briefly before step CHECK_AT so that its processes can be looked at. Sleeps change
# no numerics, and the timeouts leave room for both.
JOB = [
    *LAYOUT_REFERENCE,
    "--checkpoint.interval=2",
    "--resilience.hang_timeout_s=300",
    "--resilience.collective_timeout_s=300",
    "--resilience.warm_standby=true",
]
FAULTS = (
    f"sleep:at=train:step:step={STALL_AT}:rank=0:seconds=300;"
    f"sleep:at=train:step:step={CHECK_AT}:rank=0:seconds=4:restart=1"
)
STATUS_FIELDS = ("SigBlk", "SigIgn", "SigCgt")


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    stat = Path(f"/proc/{pid}/stat").read_text()
    ppid, _pgrp, session = stat[stat.rindex(")") + 2 :].split()[1:4]
    return {
        **{k: fields[k].strip() for k in STATUS_FIELDS},
        "ppid": ppid,
        "leads_session": str(session == str(pid)),
    }


def wait_for_attempt(run: Path, attempt: int, step: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        b = beat(run, 0)
        if b and b["attempt"] == attempt and b["step"] >= step and b["phase"] == "train":
            return
        time.sleep(0.05)
    raise AssertionError(f"rank 0 of attempt {attempt} never reached step {step}")


def wait_all_ready(run: Path, slots: int, timeout: float = 180) -> list[dict]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready = supervisor_events(run, "standby_ready")
        if len({e["slot"] for e in ready}) == slots:
            return ready
        time.sleep(0.1)
    raise AssertionError(f"not every standby of {slots} slots became ready in {timeout}s")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_restart_through_warm_standbys_is_bitwise_in_every_layout(
    layout: str, layout_references: dict[str, Path], tmp_path: Path
) -> None:
    nproc, extra = LAYOUTS[layout]
    run = tmp_path
    proc = supervise(run, *JOB, *extra, nproc=nproc, faults=FAULTS)
    try:
        wait_for_attempt(run, 0, STALL_AT - 1)
        wait_all_ready(run, nproc)
        cold = {r: proc_status(beat(run, r)["pid"]) for r in range(nproc)}
        os.kill(beat(run, nproc - 1)["pid"], signal.SIGKILL)
        wait_for_attempt(run, 1, CHECK_AT - 1)
        handed = supervisor_events(run, "standby_handoff")
        warm = {r: proc_status(beat(run, r)["pid"]) for r in range(nproc)}
    finally:
        code = finish(proc)
    assert code == 0, finish.last_output  # type: ignore[attr-defined]

    # Every rank of the new attempt was a standby that had finished importing, and kept its pid.
    assert sorted(h["rank"] for h in handed) == list(range(nproc)) and all(h["ready"] for h in handed)
    restarted = supervisor_events(run, "attempt_start")[1]
    assert sorted(restarted["pids"]) == sorted(h["pid"] for h in handed)
    assert {r["attempt"] for r in events(run, "run_start")} == {0, 1}
    # Its life as a rank began at the handoff (run_start.handoff_at, the analysis's attempt start), and
    # the supervisor recorded when it last saw the killed rank running (the incident's onset).
    sent = {h["pid"]: h["sent_at"] for h in handed}
    starts = [r for r in events(run, "run_start") if r["attempt"] == 1]
    assert all(r["handoff_at"] == pytest.approx(min(sent.values()), abs=1.0) for r in starts)
    assert all(r["handoff_at"] <= r["process_start"] for r in starts)
    (failure,) = supervisor_events(run, "failure_detected")
    assert failure["kind"] == "process_exit" and 0 < failure["detected_at"] - failure["last_seen"] < 5
    # Indistinguishable where a rank's recovery path can see it: signal dispositions, parent, session.
    assert warm == cold
    assert_matches_reference(run, layout_references[layout], steps=LAYOUT_STEPS)
    # Nothing outlives the job.
    spawned = [e["pid"] for e in supervisor_events(run, "standby_spawned")]
    assert len(spawned) >= 2 * nproc  # the first set, then the replacements once attempt 1 trained
    assert [pid for pid in spawned if alive(pid)] == []


def test_a_standby_never_outlives_its_supervisor(tmp_path: Path) -> None:
    proc = supervise(tmp_path, *JOB, faults=FAULTS)
    try:
        wait_for_attempt(tmp_path, 0, STALL_AT - 1)
        ready = wait_all_ready(tmp_path, 2)
        standbys = [e["pid"] for e in ready]
        ranks = [beat(tmp_path, r)["pid"] for r in range(2)]
        assert all(alive(pid) for pid in standbys + ranks)
        proc.kill()  # SIGKILL: the supervisor cannot clean up
        proc.wait()
        time.sleep(2.0)
        assert [pid for pid in standbys + ranks if alive(pid)] == []
    finally:
        proc.kill()
        proc.communicate()


# ---------------------------------------------------------------------------------------------- the pool


def test_only_the_per_attempt_variables_may_change_at_a_handoff() -> None:
    parked = {"OMP_NUM_THREADS": "1", "RANK": "1", "PATH": "/bin"}
    rank = {**parked, "MASTER_PORT": "1234", "TRUESTEP_ATTEMPT": "3"}
    # The launch record's per-attempt fields: the attempt, its rendezvous port, its config file and
    # that file's SHA-256 (the rank refuses a swapped attempt config: issue 27).
    assert set(PER_ATTEMPT_ENV) == {
        "MASTER_PORT",
        "TRUESTEP_ATTEMPT",
        "TRUESTEP_CONFIG_FILE",
        "TRUESTEP_CONFIG_SHA256",
    }
    assert env_differences(parked, rank) == []
    assert env_differences(parked, {**rank, "OMP_NUM_THREADS": "2"}) == ["OMP_NUM_THREADS"]
    assert env_differences(parked, {k: v for k, v in rank.items() if k != "RANK"}) == ["RANK"]
    assert env_differences({**parked, "CUDA_VISIBLE_DEVICES": "0"}, rank) == ["CUDA_VISIBLE_DEVICES"]
    # What the warm-up's imports set or removed stays, as it would in a fresh rank after those imports.
    warmed = {**{k: v for k, v in parked.items() if k != "PATH"}, "TORCHINDUCTOR_CACHE_DIR": "/tmp/x"}
    assert adopted_env(rank, parked, warmed) == {
        "OMP_NUM_THREADS": "1",
        "RANK": "1",
        "MASTER_PORT": "1234",
        "TRUESTEP_ATTEMPT": "3",
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/x",
    }


def _fake_standby(slot: int, script: str, env: dict[str, str]) -> Standby:
    ours, theirs = socket.socketpair()
    cmd = [sys.executable, "-c", script, str(theirs.fileno())]
    proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),))
    theirs.close()
    ours.setblocking(False)
    return Standby(slot, proc, ours, env, time.time())


def _record(tmp_path: Path, port: int = 1, attempt: int = 1) -> Launch:
    """A rank's launch record whose config file does not exist: the rank it becomes (fresh or from a
    standby) runs `truestep train`, reads the record and refuses the missing file (exit 2)."""
    return Launch(master_port=port, attempt=attempt, config_file=str(tmp_path / "no-such-config.toml"))


def test_a_standby_that_does_not_fit_is_discarded_and_the_rank_starts_cold(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    writer = JsonlWriter(tmp_path / "events.jsonl")
    pool = StandbyPool(tmp_path, writer, enabled=True, heartbeats=True)
    base = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1"}
    launch = _record(tmp_path)
    parked = parked_env({**base, **launch.to_env()})
    pool.standbys[0] = _fake_standby(0, "import time; time.sleep(60)", parked)
    sleeper = pool.standbys[0].proc
    changed = {**base, "OMP_NUM_THREADS": "2"}
    rank = pool.launch(0, _record(tmp_path, port=2, attempt=2), changed)
    assert rank.wait(timeout=60) == 2  # a fresh `truestep train` that read its launch record
    assert "no-such-config.toml" in capfd.readouterr().err
    assert rank.pid != sleeper.pid and sleeper.poll() is not None  # the standby was killed
    (discarded,) = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "standby_discarded"]
    assert discarded["reason"] == "the rank's environment differs in ['OMP_NUM_THREADS']"
    assert pool.standbys == {}


def _real_pool(tmp_path: Path) -> tuple[StandbyPool, dict[str, str]]:
    """A pool whose slot 0 has a real `truestep standby` for the tiny config, just started."""
    config = tmp_path / "config.toml"
    config.write_text(to_toml(load_config("tiny", [f"--run.dir={tmp_path / 'run'}"])))
    base = truestep_env()
    pool = StandbyPool(tmp_path, JsonlWriter(tmp_path / "events.jsonl"), enabled=True, heartbeats=False)
    pool.templates[0] = (Launch(master_port=1, attempt=1, config_file=str(config)), base)
    pool._spawn(0)
    return pool, base


def test_a_standby_still_importing_is_handed_its_rank_and_becomes_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pool, base = _real_pool(tmp_path)
    standby = pool.standbys[0].proc
    # At once: it is still importing torch. The next attempt's record differs only per attempt.
    rank = pool.launch(0, _record(tmp_path, port=2, attempt=2), base)
    assert rank is standby
    assert rank.wait(timeout=120) == 2, capfd.readouterr().err
    # It ran what a fresh rank runs: `truestep train`, with the record it was handed.
    assert "config error" in (err := capfd.readouterr().err) and "no-such-config.toml" in err, err
    (handoff,) = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "standby_handoff"]
    assert handoff["ready"] is False and handoff["pid"] == rank.pid


def test_a_standby_closed_without_a_handoff_never_exits_0(tmp_path: Path) -> None:
    """Exit 0 of a slot's process reads as a rank that finished: a standby that never became one must
    not produce it (it did, while its ready report met a closed socket)."""
    pool, _ = _real_pool(tmp_path)
    standby = pool.standbys.pop(0)
    standby.sock.close()
    assert standby.proc.wait(timeout=120) == 1


def test_a_standby_that_dies_before_it_is_ready_switches_warm_standby_off(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    writer = JsonlWriter(tmp_path / "events.jsonl")
    pool = StandbyPool(tmp_path, writer, enabled=True, heartbeats=False)
    pool.standbys[0] = _fake_standby(0, "raise SystemExit(3)", {})
    pool.standbys[0].proc.wait(timeout=30)
    pool.tick([])
    names = [e["event"] for e in read_jsonl(tmp_path / "events.jsonl")]
    assert names == ["standby_lost", "standby_disabled"]
    assert not pool.enabled and pool.standbys == {}
    assert "warm standby switched off for this job" in capfd.readouterr().err
