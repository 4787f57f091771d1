"""A whole node of a multi-node job lost, on one machine: two supervisors as two "nodes" share the run
directory, and `kill:node=1` SIGKILLs node 1's supervisor and its rank (a node crash, as the job sees it).
The survivor must tell this from a local rank crash (tests/test_ownership.py: restart in place) and stop
for a requeue at once, exit 77, instead of waiting for a peer that cannot come back; the relaunch (the
scheduler's requeue) resumes bitwise. With the mechanism off it restarts in place, as before. The same
on real namespaces and SLURM: tests/slurm/test_multinode_*.py."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from harness import events, truestep_env
from supervised import assert_matches_reference, finish, launch_cmd, supervisor_events, wait_for_event

DETECT_S = 3.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_job(run_dir: Path, generation: int, *overrides: str, faults: str = "") -> list[subprocess.Popen]:
    nodes = ["--nnodes=2", f"--master-port={_free_port()}", "--job-id=node-loss-test"]
    env = truestep_env({"TRUESTEP_JOB_GENERATION": str(generation), "TRUESTEP_FAULTS": faults})
    return [
        subprocess.Popen(
            [*launch_cmd(run_dir, *overrides, nproc=1), *nodes, f"--node-rank={node}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]


def test_a_node_crash_stops_the_survivor_for_a_requeue_and_the_relaunch_resumes_bitwise(
    supervised_reference: Path, tmp_path: Path
) -> None:
    first = start_job(tmp_path, 0, faults="kill:node=1:step=8")
    assert finish(first[0], timeout=240) == 77, finish.last_output  # type: ignore[attr-defined]
    assert finish(first[1], timeout=30) == -9, "node 1's supervisor was not the one killed"
    [fault] = events(tmp_path, "fault_injected")
    [seen] = supervisor_events(tmp_path, "failure_detected")
    assert (fault["scope"], fault["node"], fault["spec"]) == ("node", 1, "kill:node=1:step=8")
    assert (seen["node"], seen["kind"], seen["lost_node"], seen["how"]) == (0, "node_lost", 1, "closed"), seen
    assert seen["detected_at"] - fault["time"] < DETECT_S
    assert supervisor_events(tmp_path, "restart") == [], "the survivor restarted in place"
    [end] = supervisor_events(tmp_path, "supervisor_end")
    assert (end["node"], end["outcome"], end["exit_code"]) == (0, "node_lost", 77)

    second = start_job(tmp_path, 1)  # the requeue: a new launch of the same job
    assert [finish(p) for p in second] == [0, 0], finish.last_output  # type: ignore[attr-defined]
    by_node = {
        n: [e["attempt"] for e in supervisor_events(tmp_path, "attempt_start") if e["node"] == n]
        for n in (0, 1)
    }
    assert by_node[0] == by_node[1] == [0, 1], by_node
    assert all(e.get("host") for e in events(tmp_path) if e.get("source") == "supervisor")
    assert_matches_reference(tmp_path, supervised_reference)


def test_with_node_watch_off_a_node_crash_looks_like_a_local_failure(tmp_path: Path) -> None:
    """The ablation switch: without the supervisors' link the survivor sees only its rank failing and
    restarts in place (where it would wait for the scheduler to notice the lost node)."""
    job = start_job(tmp_path, 0, "--resilience.node_watch=false", faults="kill:node=1:step=8")
    try:
        wait_for_event(tmp_path, "restart", timeout=120)
        [seen] = supervisor_events(tmp_path, "failure_detected")
        # Its rank fails or stops beating once its peer is gone: a local failure either way.
        assert seen["node"] == 0 and seen["kind"] in ("process_exit", "stale_heartbeat"), seen
    finally:
        for proc in job:  # their ranks die with them (PR_SET_PDEATHSIG)
            proc.kill()
            proc.wait(timeout=30)
