"""Real SLURM, several nodes (the namespace cluster of conftest.py: n1..n3, each its own network namespace,
address, hostname and slurmd): a 2-node job of scripts/slurm/train.sbatch loses a node (crash), is cut
off from one (partition), or is preempted, and every time comes back and resumes -- bitwise where the
layout is the same, within fp32 tolerance with the data order kept where it shrank to one node.

Each test reads the run directory (every supervisor event names its node and host) and the job's
output, and prints the measured latencies with the machine's load (`timing:` lines, shown with -s).
"""

from __future__ import annotations

import json
import re
import time

import pytest
from multinode import (
    DETECT_CRASH_S,
    STEPS,
    assert_bitwise,
    assert_job_wide_attempts,
    events,
    last_step,
    record_fault,
    submit,
    supervisor,
    tail,
    timing,
    wait_training,
)

from truestep.analysis.mttr import incidents
from truestep.analysis.runlog import RunLog
from truestep.config.schema import ResilienceConfig
from truestep.core.names import snapshot_holder_dir
from truestep.resilience.lease import read_lease
from truestep.telemetry.jsonl import read_jsonl

pytestmark = pytest.mark.slurm

DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
DEFAULTS = ResilienceConfig()
CROSS_LAYOUT_TOLERANCE = 2e-5
"""Losses of different layouts agree within fp32 rounding (docs/determinism.md, tests/test_reshard.py)."""


def hostnames(netns, nodelist: str) -> list[str]:
    return netns.run("scontrol", "show", "hostnames", nodelist).stdout.split()


def running_on(netns, job: str, diagnose, restarts: int = 0, timeout: float = 120) -> list[str]:
    fields = netns.wait_job(
        job,
        lambda j: int(j["Restarts"]) >= restarts and j["JobState"] == "RUNNING",
        timeout,
        f"RUNNING with Restarts >= {restarts}",
        diagnose,
    )
    return hostnames(netns, fields["NodeList"])


def completed(netns, job: str, out, diagnose) -> None:
    final = netns.wait_job(job, lambda j: j["JobState"] in DONE, 240, "to finish", diagnose)
    assert final["JobState"] == "COMPLETED", f"{final.get('JobState')} {final.get('ExitCode')}\n{tail(out)}"


def test_node_crash_is_noticed_at_once_and_the_job_resumes_bitwise_on_the_spare(
    netns, multinode_reference, tmp_path
):
    reference = multinode_reference.result()
    job, run_dir, out = submit(netns, tmp_path, "crash", "--nodes=2")
    diagnose = lambda: tail(out)  # noqa: E731
    nodes = running_on(netns, job, diagnose, timeout=60)
    wait_training(netns, run_dir, out)

    victim = nodes[1]  # node rank 1; node 0 hosts the batch script, which logs the decision
    crashed = netns.crash(victim)
    record_fault(run_dir, crashed, "kill", "kill:node=1", scope="node", node=1, host=victim)

    seen = netns.wait_for(
        lambda: supervisor(run_dir, "failure_detected", kind="node_lost"),
        30,
        "node 0 to notice",
        diagnose=diagnose,
    )[0]
    timing("node crash -> survivor detects", seen["detected_at"] - crashed)
    assert (seen["node"], seen["lost_node"], seen["lost_host"], seen["how"]) == (0, 1, victim, "closed"), seen
    assert seen["detected_at"] - crashed < DETECT_CRASH_S
    end = netns.wait_for(lambda: supervisor(run_dir, "supervisor_end", node=0), 30, "node 0 to stop")[0]
    timing("node crash -> survivor stopped for a requeue", end["time"] - crashed)
    assert (end["outcome"], end["exit_code"], end["attempt"]) == ("node_lost", 77, 0), end
    assert supervisor(run_dir, "restart") == [], "the survivor restarted in place, waiting for a lost node"

    again = running_on(netns, job, diagnose, restarts=1)
    timing("node crash -> job running again (SLURM declares the node down, requeues)", time.time() - crashed)
    assert victim not in again and len(again) == 2, f"requeued onto {again}, not the spare"
    completed(netns, job, out, diagnose)

    log = out.read_text()
    # Then SLURM declares the node down and requeues the job itself, or the script does (whichever first).
    # The survivor's 77 is seen by the script when srun returns first, else only by srun (the step is
    # then cancelled for the node failure before srun returns, and the script sees -1).
    survivor_77 = "launcher exited with 77" in log or re.search(
        r"srun: error: \S+: task \d+: Exited with exit code 77", log
    )
    assert survivor_77, tail(out)
    assert "another node of the job was lost" in log or "SLURM is already requeueing" in log, tail(out)
    assert_bitwise(run_dir, reference)
    assert_job_wide_attempts(run_dir, {0: 2, 1: 2})
    hosts = {e["host"] for e in supervisor(run_dir, "attempt_start", attempt=1)}
    assert hosts == set(again), hosts

    [incident] = incidents(RunLog.load(run_dir))
    assert incident.kind == "kill" and incident.mttr_s is not None, incident
    assert all(v is not None for v in incident.phases_s.values()), incident.phases_s
    assert incident.phases_s["detect"] < DETECT_CRASH_S
    for phase, seconds in incident.phases_s.items():
        timing(f"node crash MTTR phase {phase}", seconds)
    timing("node crash MTTR (fault -> first new step)", incident.mttr_s)


def test_a_lost_rank_and_then_a_lost_node_are_restored_from_the_other_nodes_memory(
    netns, multinode_reference, tmp_path
):
    """Snapshots every step, no disk checkpoint (interval 0): only memory can serve. Rank 1 (node 1) is
    killed: both nodes restart in place, node 0's rank -- which exited with an error, its peer gone --
    keeps its memory, and rank 1 comes back from rank 0's copy. Then node 1 crashes: the job is requeued
    onto node 0 (the same host) and the spare, and again rank 0 restores its own memory and rank 1 rank
    0's copy. At most one step lost each time; the run is the failure-free one bit for bit."""
    reference = multinode_reference.result()
    memory = tmp_path / "memory"
    snapshots = ("--resilience.snapshot_every_steps=1", f"--resilience.snapshot_dir={memory}")
    # A rank with no heartbeat by then is judged hung and its memory dropped: allow a loaded machine.
    slow_start = "--resilience.startup_timeout_s=60"
    job, run_dir, out = submit(
        netns, tmp_path, "memory", "--nodes=2", extra=(*snapshots, "--checkpoint.interval=0", slow_start),
        faults="kill:rank=1:step=12",  # attempt 0 only
    )  # fmt: skip
    diagnose = lambda: tail(out)  # noqa: E731
    nodes = running_on(netns, job, diagnose, timeout=60)
    netns.wait_for(
        lambda: last_step(run_dir) >= 24 and events(run_dir, "snapshot_agreed", attempt=1),
        240,
        "attempt 1 (after the rank kill) at step >= 24 with an agreed snapshot",
        diagnose=diagnose,
    )
    lease = read_lease(run_dir)
    assert lease is not None and lease.run_id, lease
    for rank, host in enumerate(nodes):  # each host's memory under its own name: its rank's and its buddy's
        held = snapshot_holder_dir(memory, lease.run_id, host, rank).glob("c*.bin")
        assert {p.name.split(".")[0] for p in held} == {"c00000", "c00001"}, (rank, host)

    victim = nodes[1]
    crashed = netns.crash(victim)
    record_fault(run_dir, crashed, "kill", "kill:node=1", scope="node", node=1, host=victim)
    again = running_on(netns, job, diagnose, restarts=1)
    timing("node crash -> job running again (memory path)", time.time() - crashed)
    assert again[0] == nodes[0] and victim not in again and len(again) == 2, (nodes, again)
    completed(netns, job, out, diagnose)

    lost = [(e["host"], e["ranks"]) for e in supervisor(run_dir, "memory_lost")]
    assert lost == [(victim, [1])], f"only the killed rank's memory goes (node 0's rank kept its): {lost}"
    assert read_lease(run_dir).run_id == lease.run_id, "the requeued job took another run_id"
    restores = events(run_dir, "memory_restore")
    assert [r["attempt"] for r in restores] == [1, 2], restores
    for restore in restores:
        assert (restore["source"], restore["from_buddies"], restore["sources"]) == (
            "memory",
            [1],
            {"0": 0, "1": 0},
        )
        assert restore["steps_lost"] <= 1, restore
        assert f"restored step {restore['step']} from memory" in out.read_text(), tail(out)
        timing(
            f"memory restore, attempt {restore['attempt']} (rank 1 over the network)", restore["restore_s"]
        )
    assert events(run_dir, "checkpoint_restore") == []
    assert [e["attempt"] for e in events(run_dir, "memory_restore_skipped")] == [0]  # the fresh start
    checks = [e for e in events(run_dir) if e["event"].startswith("resume_")]
    assert [e["attempt"] for e in checks] == [1, 2], checks
    for restore, check in zip(restores, checks, strict=True):
        # Verified when a step was lost (its pre-fault line is replayed); a restore that lost nothing (the
        # crash came after the snapshot's agreement, before the next step's line) has nothing to replay.
        expected = "resume_verified" if restore["steps_lost"] >= 1 else "resume_unverified"
        assert check["event"] == expected, (restore, check)
    assert_bitwise(run_dir, reference)
    assert_job_wide_attempts(run_dir, {0: 2, 1: 2, 2: 2})
    for incident in incidents(RunLog.load(run_dir)):
        assert incident.mttr_s is not None, incident
        timing(f"MTTR from memory after a {incident.kind} at step {incident.pre_fault_step}", incident.mttr_s)


def test_partition_is_detected_on_both_sides_and_the_job_resumes_on_fewer_nodes(
    netns, multinode_reference, tmp_path
):
    reference = multinode_reference.result()
    # No spare: once the cut-off node is declared down, the job is told to go on with one node.
    netns.run("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=truestep-test-no-spare")
    job, run_dir, out = submit(netns, tmp_path, "partition", "--nodes=2")
    diagnose = lambda: tail(out)  # noqa: E731
    nodes = running_on(netns, job, diagnose, timeout=60)
    assert len(nodes) == 2, nodes
    wait_training(netns, run_dir, out)

    victim = nodes[1]
    cut = netns.partition(victim)  # link down: no RST, packets vanish
    record_fault(run_dir, cut, "partition", "partition:node=1", scope="node", node=1, host=victim)

    def both_sides() -> list[dict]:
        found = {e["node"]: e for e in supervisor(run_dir, "failure_detected")}
        return list(found.values()) if len(found) == 2 else []

    seen = netns.wait_for(both_sides, 60, "both sides to detect the partition", diagnose=diagnose)
    for side in seen:
        timing(f"partition -> node {side['node']} ({side['host']}) detects", side["detected_at"] - cut)
        assert side["kind"] == "node_lost" and side["how"] == "silent", side
        assert side["lost_node"] == 1 - side["node"], side
        assert side["detected_at"] - cut < DEFAULTS.hang_timeout_s, side
    ends = netns.wait_for(lambda: len(supervisor(run_dir, "supervisor_end")) == 2, 30, "both sides to stop")
    assert ends and all(
        (e["outcome"], e["exit_code"]) == ("node_lost", 77) for e in supervisor(run_dir, "supervisor_end")
    )

    netns.wait_job(
        job, lambda j: int(j["Restarts"]) >= 1, 120, "requeued (the cut-off node declared down)", diagnose
    )
    timing("partition -> job requeued", time.time() - cut)
    netns.run("scontrol", "update", f"JobId={job}", "NumNodes=1", "NumTasks=1")  # what a user would do
    again = running_on(netns, job, diagnose, restarts=1)
    timing("partition -> job running again on fewer nodes", time.time() - cut)
    assert again == [nodes[0]], again
    moved_on = netns.wait_for(lambda: supervisor(run_dir, "attempt_start", attempt=1), 60, "attempt 1")[0][
        "time"
    ]
    netns.heal(victim)  # the link comes back while the job runs on without that node
    netns.wait_for(
        lambda: not netns.processes(victim), 30, f"no truestep process left on {victim}",
        diagnose=lambda: str(netns.processes(victim)),
    )  # fmt: skip
    completed(netns, job, out, diagnose)

    # The cut-off side stood aside before the job moved on: nothing of it after that, no stale commit.
    late = [e for e in events(run_dir) if e.get("host") == victim and e["time"] >= moved_on]
    stale = [r for r in events(run_dir) + read_jsonl(run_dir / "metrics.jsonl") if r.get("attempt") == 0]
    assert late == [] and [r for r in stale if r["time"] >= moved_on and r.get("source") != "fault"] == []
    for marker in (run_dir / "checkpoints").glob("step_*/COMMITTED"):
        record = json.loads(marker.read_text())
        assert record.get("incarnation") == 1 or marker.stat().st_mtime < moved_on, (marker, record)

    restore = events(run_dir, "checkpoint_restore", attempt=1)[0]
    assert restore["layout_changed"] and restore["saved_layout"]["world_size"] == 2, restore
    assert restore["restored_data_position"] is True
    got = {m["step"]: m for m in read_jsonl(run_dir / "metrics.jsonl")}  # the last line of each step
    want = {m["step"]: m for m in read_jsonl(reference / "metrics.jsonl")}
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for step, line in want.items():  # the data order: the same tokens, and losses within fp32 tolerance
        assert got[step]["tokens_seen"] == line["tokens_seen"], step
        assert abs(got[step]["loss"] - line["loss"]) < CROSS_LAYOUT_TOLERANCE, (step, got[step], line)
    assert_job_wide_attempts(run_dir, {0: 2, 1: 1})


def test_preempting_a_multinode_job_stops_every_node_at_one_step_and_resumes_bitwise(
    netns, multinode_reference, tmp_path
):
    reference = multinode_reference.result()
    # Keep every checkpoint: the stop step's per-rank files are read after the run has finished.
    job, run_dir, out = submit(netns, tmp_path, "preempt", "--nodes=2", extra=("--checkpoint.keep_last_n=0",))
    diagnose = lambda: tail(out)  # noqa: E731
    running_on(netns, job, diagnose, timeout=60)
    wait_training(netns, run_dir, out)

    netns.run("scontrol", "requeue", job)  # SLURM: SIGTERM to every process of the job, on every node
    signalled = time.time()
    running_on(netns, job, diagnose, restarts=1)
    timing("scontrol requeue of a 2-node job -> running again", time.time() - signalled)
    completed(netns, job, out, diagnose)

    for node in (0, 1):
        end = supervisor(run_dir, "supervisor_end", node=node, attempt=0)
        assert end and (end[0]["outcome"], end[0]["exit_code"]) == ("requeue", 75), end
        assert supervisor(run_dir, "supervisor_signal", node=node, signal="SIGTERM"), (
            f"node {node} got no SIGTERM"
        )
    [agreed] = events(run_dir, "signal_received", attempt=0)
    stop = agreed["stop_step"]
    first = [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if m["attempt"] == 0]
    assert max(first) == stop, "the first attempt went on after the agreed stop step"
    saves = [e for e in events(run_dir, "checkpoint_save", attempt=0) if e["step"] >= stop]
    assert [e["step"] for e in saves] == [stop], saves  # one emergency checkpoint, at the stop step
    assert events(run_dir, "checkpoint_commit", attempt=0, step=stop)
    ckpt = run_dir / "checkpoints" / f"step_{stop:08d}"
    for rank in (0, 1):  # both nodes' ranks saved their state at that same step
        state = json.loads((ckpt / f"rank{rank:05d}.json").read_text())
        assert state["train_state"]["step"] == stop and state["loader"]["next_batch"] == stop, state
    assert events(run_dir, "checkpoint_restore", attempt=1)[0]["step"] == stop
    assert_bitwise(run_dir, reference)
    assert_job_wide_attempts(run_dir, {0: 2, 1: 2})
