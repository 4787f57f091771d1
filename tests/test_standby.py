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
from truestep.core.launch import HANDED_ENV, Launch
from truestep.supervisor.handoff import adopted_env, env_differences, parked_env
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


def template_ready(run: Path, timeout: float = 180) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready = supervisor_events(run, "standby_ready")
        if ready:
            return ready[0]
        time.sleep(0.1)
    raise AssertionError(f"the warm template did not become ready in {timeout}s")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_restart_through_warm_standbys_is_bitwise_in_every_layout(
    layout: str, layout_references: dict[str, Path], tmp_path: Path
) -> None:
    nproc, extra = LAYOUTS[layout]
    run = tmp_path
    proc = supervise(run, *JOB, *extra, nproc=nproc, faults=FAULTS)
    try:
        wait_for_attempt(run, 0, STALL_AT - 1)
        template_ready(run)
        first = {r: proc_status(beat(run, r)["pid"]) for r in range(nproc)}
        os.kill(beat(run, nproc - 1)["pid"], signal.SIGKILL)
        wait_for_attempt(run, 1, CHECK_AT - 1)
        handed = supervisor_events(run, "standby_handoff")
        second = {r: proc_status(beat(run, r)["pid"]) for r in range(nproc)}
    finally:
        code = finish(proc)
    assert code == 0, finish.last_output  # type: ignore[attr-defined]

    # Every rank of both attempts was forked by the one template, the restart's from a ready template.
    (spawned,) = supervisor_events(run, "standby_spawned")
    assert {h["template"] for h in handed} == {spawned["pid"]}
    assert sorted((h["attempt"], h["rank"]) for h in handed) == [(a, r) for a in (0, 1) for r in range(nproc)]
    assert all(h["ready"] for h in handed if h["attempt"] == 1)
    for attempt, start in enumerate(supervisor_events(run, "attempt_start")):
        assert sorted(start["pids"]) == sorted(h["pid"] for h in handed if h["attempt"] == attempt)
    assert {r["attempt"] for r in events(run, "run_start")} == {0, 1}
    # Its life as a rank began at the handoff (run_start.handoff_at, the analysis's attempt start), and
    # the supervisor recorded when it last saw the killed rank running (the incident's onset).
    sent = {h["pid"]: h["sent_at"] for h in handed if h["attempt"] == 1}
    starts = [r for r in events(run, "run_start") if r["attempt"] == 1]
    assert all(r["handoff_at"] == pytest.approx(min(sent.values()), abs=1.0) for r in starts)
    assert all(r["handoff_at"] <= r["process_start"] for r in starts)
    (failure,) = supervisor_events(run, "failure_detected")
    assert failure["kind"] == "process_exit" and 0 < failure["detected_at"] - failure["last_seen"] < 5
    # A fresh rank's place: the supervisor's own child, leading its own session, the same signal
    # dispositions in every attempt (a cold rank's are compared in test_a_forked_rank_looks_like_a_cold_one).
    assert {(s["ppid"], s["leads_session"]) for s in (*first.values(), *second.values())} == {
        (str(proc.pid), "True")
    }
    assert second == first
    assert_matches_reference(run, layout_references[layout], steps=LAYOUT_STEPS)
    # Nothing outlives the job.
    assert not alive(spawned["pid"]) and [h["pid"] for h in handed if alive(h["pid"])] == []


def test_a_standby_never_outlives_its_supervisor(tmp_path: Path) -> None:
    proc = supervise(tmp_path, *JOB, faults=FAULTS)
    try:
        wait_for_attempt(tmp_path, 0, STALL_AT - 1)
        standbys = [template_ready(tmp_path)["pid"]]
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


def test_only_who_the_rank_is_may_change_at_a_handoff() -> None:
    parked = {"OMP_NUM_THREADS": "1", "PATH": "/bin"}
    rank = {**parked, "RANK": "1", "LOCAL_RANK": "1", "MASTER_PORT": "1234", "TRUESTEP_ATTEMPT": "3"}
    # Which rank of the node it is, and the launch record's per-attempt fields: the attempt, its
    # rendezvous port, its config file and that file's SHA-256 (the rank refuses a swapped attempt config).
    assert set(HANDED_ENV) == {
        "RANK",
        "LOCAL_RANK",
        "MASTER_PORT",
        "TRUESTEP_ATTEMPT",
        "TRUESTEP_CONFIG_FILE",
        "TRUESTEP_CONFIG_SHA256",
    }
    assert env_differences(parked, rank) == []
    assert env_differences(parked, {**rank, "OMP_NUM_THREADS": "2"}) == ["OMP_NUM_THREADS"]
    assert env_differences(parked, {**rank, "WORLD_SIZE": "4"}) == ["WORLD_SIZE"]
    assert env_differences({**parked, "CUDA_VISIBLE_DEVICES": "0"}, rank) == ["CUDA_VISIBLE_DEVICES"]
    assert parked_env(rank) == parked
    # What the warm-up's imports set or removed stays, as it would in a fresh rank after those imports.
    warmed = {**{k: v for k, v in parked.items() if k != "PATH"}, "TORCHINDUCTOR_CACHE_DIR": "/tmp/x"}
    assert adopted_env(rank, parked, warmed) == {
        "OMP_NUM_THREADS": "1",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "MASTER_PORT": "1234",
        "TRUESTEP_ATTEMPT": "3",
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/x",
    }


def _fake_template(script: str, env: dict[str, str]) -> Standby:
    ours, theirs = socket.socketpair()
    cmd = [sys.executable, "-c", script, str(theirs.fileno())]
    proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),))
    theirs.close()
    ours.setblocking(False)
    return Standby(proc, ours, env)


def _record(tmp_path: Path, port: int = 1, attempt: int = 1, rank: int = 0) -> Launch:
    """A rank's launch record whose config file does not exist: the rank it becomes (fresh or forked)
    runs `truestep train`, reads the record and refuses the missing file (exit 2)."""
    return Launch(
        rank=rank,
        world_size=2,
        local_rank=rank,
        local_world_size=2,
        master_port=port,
        attempt=attempt,
        config_file=str(tmp_path / "no-such-config.toml"),
    )


def test_a_template_that_does_not_fit_is_discarded_and_the_rank_starts_cold(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    writer = JsonlWriter(tmp_path / "events.jsonl")
    pool = StandbyPool(tmp_path, writer, enabled=True, heartbeats=True)
    pool.started = True
    base = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1"}
    launch = _record(tmp_path)
    pool.standby = _fake_template("import time; time.sleep(60)", parked_env({**base, **launch.to_env()}))
    sleeper = pool.standby.proc
    changed = {**base, "OMP_NUM_THREADS": "2"}
    try:
        rank = pool.launch(0, _record(tmp_path, port=2, attempt=2), changed)
        assert rank.wait(timeout=60) == 2  # a fresh `truestep train` that read its launch record
    finally:
        pool.close()
    assert "no-such-config.toml" in capfd.readouterr().err
    assert rank.pid != sleeper.pid and sleeper.poll() is not None  # the template was killed
    (discarded,) = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "standby_discarded"]
    assert discarded["reason"] == "the rank's environment differs in ['OMP_NUM_THREADS']"
    assert pool.standby is None


def _real_pool(tmp_path: Path) -> tuple[StandbyPool, dict[str, str]]:
    """A pool with a real `truestep standby` template for the tiny config, just started."""
    config = tmp_path / "config.toml"
    config.write_text(to_toml(load_config("tiny", [f"--run.dir={tmp_path / 'run'}"])))
    base = truestep_env()
    pool = StandbyPool(tmp_path, JsonlWriter(tmp_path / "events.jsonl"), enabled=True, heartbeats=False)
    pool.template = (
        Launch(world_size=2, local_world_size=2, master_port=1, attempt=1, config_file=str(config)),
        base,
    )
    pool._spawn()
    pool.started = True
    return pool, base


def test_a_template_still_importing_forks_every_rank_handed_to_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pool, base = _real_pool(tmp_path)
    assert pool.standby is not None
    template = pool.standby.proc
    try:
        # At once: it is still importing torch. Two ranks of the next attempt, told apart by their record.
        ranks = [pool.launch(r, _record(tmp_path, port=2, attempt=2, rank=r), base) for r in (0, 1)]
        codes = [rank.wait(timeout=120) for rank in ranks]
        err = capfd.readouterr().err
        assert codes == [2, 2], err
        assert template.poll() is None  # it stays, for the next attempt
    finally:
        pool.close()
    # Each ran what a fresh rank runs: `truestep train`, with the record it was handed (the config error
    # is said by rank 0 only, as in any job).
    assert err.count("config error") == 1 and "no-such-config.toml" in err, err
    handoffs = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "standby_handoff"]
    assert [(h["rank"], h["pid"]) for h in handoffs] == [(0, ranks[0].pid), (1, ranks[1].pid)]
    assert handoffs[0]["ready"] is False and handoffs[0]["parked_s"] is None
    assert len({template.pid, *(r.pid for r in ranks)}) == 3
    assert template.wait(timeout=30) != 0


def test_a_template_closed_never_exits_0(tmp_path: Path) -> None:
    """Exit 0 of a node's process reads as a rank that finished: a template must not produce it (a
    standby did, while its ready report met a closed socket)."""
    pool, _ = _real_pool(tmp_path)
    assert pool.standby is not None
    template = pool.standby
    pool.standby = None
    template.sock.close()
    assert template.proc.wait(timeout=120) == 1
    pool.close()


def test_a_template_that_dies_before_it_is_ready_switches_warm_standby_off(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    writer = JsonlWriter(tmp_path / "events.jsonl")
    pool = StandbyPool(tmp_path, writer, enabled=True, heartbeats=False)
    pool.standby = _fake_template("raise SystemExit(3)", {})
    pool.standby.proc.wait(timeout=30)
    pool.tick([])
    pool.close()
    names = [e["event"] for e in read_jsonl(tmp_path / "events.jsonl")]
    assert names == ["standby_lost", "standby_disabled"]
    assert not pool.enabled and pool.standby is None
    assert "warm standby switched off for this job" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("warmup", "said"),
    [
        ("threading.Thread(target=time.sleep, args=(30,), daemon=True).start()", "threads in this process"),
        ('setattr(torch.cuda, "is_initialized", lambda: True)', "the warm-up initialized CUDA"),
    ],
)
def test_a_template_refuses_to_fork_what_a_fork_would_break(warmup: str, said: str) -> None:
    """A fork copies one thread and no CUDA context: a template whose warm-up left either must say so
    and exit before it is ready (the pool then switches warm standby off), never fork a broken rank."""
    script = f"""
import socket, threading, time, torch
from truestep.supervisor.handoff import serve
ours, theirs = socket.socketpair()
serve(theirs.detach(), lambda: ({warmup}, (lambda: None))[1])
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], env=truestep_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1 and said in proc.stderr, proc.stderr
