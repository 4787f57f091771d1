"""One owner per run directory (issue 9): the lease refuses a second job and names its holder, a dead
holder's lease is taken over, a stale attempt is fenced before it can publish a checkpoint, ranks die
with their supervisor, and every node logs the same number for one attempt."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import Future
from functools import partial
from pathlib import Path

import pytest

from harness import TINY, events, truestep_env
from supervised import (
    HOLD_OVERRIDE,
    alive,
    assert_matches_reference,
    finish,
    hold,
    launch_cmd,
    one_line,
    pids_of_attempts,
    supervise,
    supervisor_events,
    wait_for_event,
    wait_until_held,
)
from truestep.checkpoint.catalog import MARKER, step_dir_name
from truestep.checkpoint.saver import Checkpointer, PendingSave
from truestep.checkpoint.shard_writer import ShardWriter
from truestep.config.schema import CheckpointConfig, ResilienceConfig
from truestep.core.errors import FencedError, RunDirBusyError
from truestep.parallel.dist import DistContext
from truestep.resilience.lease import RunDirLease, check_fence, read_lease
from truestep.supervisor.nodes import JobNodes
from truestep.telemetry.run_logs import RunLogs


@pytest.mark.multiprocess
def test_a_second_job_into_a_leased_directory_is_refused(supervised_reference: Path, tmp_path: Path) -> None:
    # Rank 0 is held stopped at step 6 (and continued below) so the job outlasts both intruders; neither
    # its stale heartbeat nor its stalled step may end the attempt meanwhile (on a loaded machine the two
    # intruders took longer than the suite's 4 s hang timeout, and the supervisor restarted rank 0).
    timeouts = ("--resilience.liveness_timeout_s=120", "--resilience.hang_timeout_s=120")
    proc = supervise(tmp_path, *timeouts, faults="hang:rank=0:step=6")
    stopped = wait_for_event(tmp_path, "fault_injected")
    holder = read_lease(tmp_path)
    assert holder is not None and holder.pid == proc.pid and not holder.released
    train = [sys.executable, "-m", "truestep", "train", "tiny", f"--run.dir={tmp_path}", *TINY]
    for cmd in (launch_cmd(tmp_path), train):
        other = subprocess.run(cmd, env=truestep_env(), capture_output=True, text=True, timeout=120)
        assert other.returncode == 4, other.stderr
        line = one_line(other.stderr)
        assert "is in use by job" in line and f"pid {proc.pid}" in line and f"host {holder.host}" in line
    rank0 = next(e["pids"][0] for e in supervisor_events(tmp_path, "attempt_start"))
    assert stopped["rank"] == 0
    os.kill(rank0, signal.SIGCONT)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    assert supervisor_events(tmp_path, "failure_detected") == []
    assert len(supervisor_events(tmp_path, "supervisor_start")) == 1  # the refused jobs wrote nothing
    assert {e["attempt"] for e in events(tmp_path, "run_start")} == {0}
    assert_matches_reference(tmp_path, supervised_reference)


@pytest.mark.multiprocess
def test_supervisor_sigkill_takes_its_ranks_along_and_the_next_job_takes_over(
    supervised_reference: Path, tmp_path: Path
) -> None:
    proc = supervise(tmp_path, HOLD_OVERRIDE, faults=hold(rank=1))
    wait_until_held(tmp_path, rank=1)  # mid-run whatever this machine's speed
    ranks = pids_of_attempts(tmp_path)
    assert all(alive(pid) for pid in ranks), ranks
    proc.kill()
    killed = time.time()
    proc.communicate()
    while any(alive(pid) for pid in ranks) and time.time() - killed < 2.0:
        time.sleep(0.02)
    assert not [pid for pid in ranks if alive(pid)], "ranks outlived their supervisor by 2 s"
    assert finish(supervise(tmp_path)) == 0, finish.last_output  # type: ignore[attr-defined]
    assert len(supervisor_events(tmp_path, "lease_taken_over")) == 1
    assert_matches_reference(tmp_path, supervised_reference)


@pytest.mark.multiprocess
def test_a_rank_whose_supervisor_is_already_gone_exits_at_once(tmp_path: Path) -> None:
    # A supervisor pid that is not this rank's parent: it died before the rank asked to die with it.
    env = truestep_env({"TRUESTEP_SUPERVISOR_PID": "1", "TRUESTEP_ATTEMPT": "0", "TRUESTEP_JOB_ID": "j"})
    cmd = [sys.executable, "-m", "truestep", "train", "tiny", f"--run.dir={tmp_path}", *TINY]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 5
    assert "the supervisor (pid 1) that started this rank is gone" in one_line(proc.stderr)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.multiprocess
def test_a_stale_attempt_is_fenced_before_it_publishes(tmp_path: Path) -> None:
    """Rank 0 is held inside the step-10 commit, just before the marker; meanwhile a newer attempt of
    the same job takes the lease (a requeue while this attempt was cut off). The stale attempt must
    not publish step 10, must stop writing, and must not restart."""
    proc = supervise(tmp_path, faults="sleep:at=save:before-marker:step=10:rank=0:seconds=5")
    wait_for_event(tmp_path, "fault_injected")
    lease = json.loads((tmp_path / "lease.json").read_text())
    lease.update(pid=os.getpid(), incarnation=lease["incarnation"] + 1)
    (tmp_path / "lease.json").write_text(json.dumps(lease))
    moved_on = time.time()
    assert finish(proc, timeout=60) == 5, finish.last_output  # type: ignore[attr-defined]
    assert not (tmp_path / "checkpoints" / step_dir_name(10) / MARKER).exists()
    # Ranks re-check the lease every FENCE_CHECK_S (2 s): after that (plus a beat and slack) they are gone.
    late = [e for e in events(tmp_path) if e["time"] > moved_on + 3.0 and e.get("source") != "supervisor"]
    assert late == [], late
    assert supervisor_events(tmp_path, "restart") == []
    assert supervisor_events(tmp_path, "supervisor_end")[-1]["exit_code"] == 5


def _committer(tmp_path: Path, job: str, incarnation: int) -> tuple[Checkpointer, PendingSave]:
    root = tmp_path / "checkpoints"
    ckpt_dir = root / step_dir_name(4)
    ckpt_dir.mkdir(parents=True)
    (ckpt_dir / "rank00000.json").write_text("{}")
    logs = RunLogs(tmp_path, attempt=incarnation, enabled=True)
    fence = partial(check_fence, tmp_path, job, incarnation)
    checkpointer = Checkpointer(root, CheckpointConfig(), DistContext(), logs, {}, fence, incarnation)
    done: Future = Future()
    done.set_result(None)
    writer = ShardWriter(ckpt_dir, 4)
    writer.digests = []  # as if DCP had finished a save of no shards: the commit lists the directory
    return checkpointer, PendingSave(4, ckpt_dir, done, time.perf_counter(), "interval", writer)


@pytest.mark.parametrize("newer", ["lease", "marker", "none"])
def test_commit_checks_the_fence(tmp_path: Path, newer: str) -> None:
    lease = RunDirLease(tmp_path, "job-a", ttl_s=30)
    lease.acquire()
    mine = lease.begin_attempt()
    checkpointer, pending = _committer(tmp_path, "job-a", mine)
    if newer == "lease":
        lease.begin_attempt()  # the job moved on to attempt mine + 1
    if newer == "marker":
        old = tmp_path / "checkpoints" / step_dir_name(9)
        old.mkdir()
        (old / MARKER).write_text(json.dumps({"step": 9, "incarnation": mine + 1}))
    if newer == "none":
        checkpointer._commit(pending)
        marker = json.loads((pending.ckpt_dir / MARKER).read_text())
        assert marker["incarnation"] == mine
        return
    with pytest.raises(FencedError):
        checkpointer._commit(pending)
    assert not (pending.ckpt_dir / MARKER).exists()


@pytest.mark.multiprocess
def test_lease_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path: Path) -> None:
    first = RunDirLease(tmp_path, "job-a", ttl_s=30)
    first.acquire()
    assert first.begin_attempt() == 0
    with pytest.raises(RunDirBusyError, match=f"pid {os.getpid()}"):
        RunDirLease(tmp_path, "job-b", ttl_s=30).acquire()
    # A holder on this host whose process is gone: taken over, and the attempt count goes on.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    record = json.loads((tmp_path / "lease.json").read_text())
    record["pid"] = int(dead.stdout)
    (tmp_path / "lease.json").write_text(json.dumps(record))
    second = RunDirLease(tmp_path, "job-b", ttl_s=30)
    assert second.acquire() is not None
    assert second.begin_attempt() == 1
    # A holder on another host is alive while it renews, stale after the TTL.
    record = json.loads((tmp_path / "lease.json").read_text())
    record.update(host="elsewhere", renewed_at=time.time())
    (tmp_path / "lease.json").write_text(json.dumps(record))
    with pytest.raises(RunDirBusyError, match="host elsewhere"):
        RunDirLease(tmp_path, "job-c", ttl_s=30).acquire()
    record["renewed_at"] = time.time() - 31
    (tmp_path / "lease.json").write_text(json.dumps(record))
    third = RunDirLease(tmp_path, "job-c", ttl_s=30)
    third.acquire()
    assert third.begin_attempt() == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
def test_attempt_numbers_agree_across_nodes(supervised_reference: Path, tmp_path: Path) -> None:
    """Two supervisors, one per "node", share the run directory; a rank on node 1 is killed. Both
    nodes restart, and every record of one attempt carries one number."""
    nodes = ["--nnodes=2", f"--master-port={_free_port()}", "--job-id=two-node-test"]
    env = truestep_env({"TRUESTEP_FAULTS": "kill:rank=1:step=8"})
    procs = []
    for node in (0, 1):
        cmd = launch_cmd(tmp_path, nproc=1) + [*nodes, f"--node-rank={node}", "--allow-env-faults"]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    assert [finish(p) for p in procs] == [0, 0], finish.last_output  # type: ignore[attr-defined]
    by_node = {
        n: [e["attempt"] for e in supervisor_events(tmp_path, "attempt_start") if e["node"] == n]
        for n in (0, 1)
    }
    assert by_node[0] == by_node[1] == [0, 1], by_node
    assert [e["attempt"] for e in events(tmp_path, "run_start")] == [0, 1]
    assert_matches_reference(tmp_path, supervised_reference)


def test_node_0_ending_the_attempt_does_not_fence_the_other_nodes(tmp_path: Path) -> None:
    """Node 0's supervisor releases the lease as soon as its ranks are done (a preemption's emergency
    save): another node whose ranks are still exiting from the same stop is not fenced by that. A
    release by another launch of the job, or of an older attempt, still fences."""
    lease = RunDirLease(tmp_path, "job-a", ttl_s=30)
    lease.acquire()
    attempt = lease.begin_attempt()
    node1 = JobNodes(tmp_path, "job-a", 1, 2, "127.0.0.1", ResilienceConfig(node_watch=False))
    assert node1.check(attempt) is None
    lease.release()
    node1._fence_checked = 0.0  # re-read the lease now, not FENCE_CHECK_S later
    assert node1.check(attempt) is None
    check_fence(tmp_path, "job-a", attempt, ended_ok=True)  # a rank on node 1, still exiting
    with pytest.raises(FencedError):  # node 0's own ranks (and its commits) are fenced by a release
        check_fence(tmp_path, "job-a", attempt)
    with pytest.raises(FencedError):  # it released attempt 0; attempt -1 of this node is stale
        node1.before_restart(attempt, time.monotonic())
    node1._fence_checked = 0.0
    with pytest.raises(FencedError, match="standing aside"):
        node1.check(attempt - 1)
    record = json.loads((tmp_path / "lease.json").read_text())
    record["generation"] = "7"  # the next launch of the job (a requeue) released it: this one is over
    (tmp_path / "lease.json").write_text(json.dumps(record))
    node1._fence_checked = 0.0
    with pytest.raises(FencedError, match="standing aside"):
        node1.check(attempt)
