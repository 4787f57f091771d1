"""A whole node of a multi-node job lost, on one machine: two supervisors as two "nodes" share the run
directory, and `kill:node=1` SIGKILLs node 1's supervisor and its rank (a node crash, as the job sees it).
The survivor must tell this from a local rank crash (tests/test_ownership.py: restart in place) and stop
for a requeue at once, exit 77, instead of waiting for a peer that cannot come back; the relaunch (the
scheduler's requeue) resumes bitwise, and the instrument's report covers it. With the mechanism off the
survivor restarts in place, as before. The same on real namespaces and SLURM: tests/slurm/test_multinode_*.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness import events, truestep_env
from supervised import launch_cmd, supervisor_events, wait_for_event

pytestmark = pytest.mark.multiprocess

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


def test_a_node_crash_stops_the_survivor_and_the_instrument_reports_it_end_to_end(tmp_path: Path) -> None:
    """`truestep experiment --nnodes 2`: reference, floor and a run whose node 1 crashes at step 12. The
    survivor notices at once and stops (77) without a restart; the job is relaunched as a whole (the
    scheduler's requeue); the run is bitwise equal to the reference; the report names the node."""
    out = tmp_path / "exp"
    cmd = [sys.executable, "-m", "truestep", "experiment", "demo", f"--out={out}", "--nproc=1", "--nnodes=2"]
    cmd += ["--fault=kill:node=1:step=12", "--train.max_steps=20", "--repeats=1"]
    proc = subprocess.run(cmd, env=truestep_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = out / "runs" / "faulted"
    [fault] = events(run, "fault_injected")
    [seen] = supervisor_events(run, "failure_detected")
    assert (fault["scope"], fault["node"], fault["spec"]) == ("node", 1, "kill:node=1:step=12")
    assert fault["host"] == socket.gethostname() == seen["lost_host"]
    assert (seen["node"], seen["kind"], seen["lost_node"], seen["how"]) == (0, "node_lost", 1, "closed"), seen
    assert seen["detected_at"] - fault["time"] < DETECT_S
    assert supervisor_events(run, "restart") == [], "the survivor restarted in place"
    ends = [
        (e["node"], e["attempt"], e["outcome"], e["exit_code"])
        for e in supervisor_events(run, "supervisor_end")
    ]
    assert ends[0] == (0, 0, "node_lost", 77) and sorted(ends[1:]) == [
        (0, 1, "completed", 0),
        (1, 1, "completed", 0),
    ]
    by_node = {
        n: [e["attempt"] for e in supervisor_events(run, "attempt_start") if e["node"] == n] for n in (0, 1)
    }
    assert by_node[0] == by_node[1] == [0, 1], by_node
    assert all(e.get("host") for e in events(run) if e.get("source") == "supervisor")

    [group] = json.loads((out / "summary.json").read_text())["groups"]
    faulted = group["runs"]["faulted"]
    assert (
        faulted["verdict"]["status"] == "bitwise" and faulted["comparison"]["fraction_bitwise_equal"] == 1.0
    )
    assert faulted["verdict"]["label"].startswith("bitwise: 20/20 steps, "), faulted["verdict"]["label"]
    [incident] = faulted["incidents"]
    assert incident["kind"] == "kill" and all(v is not None for v in incident["phases_s"].values()), incident
    assert incident["phases_s"]["detect"] < DETECT_S
    assert "kill:node=1:step=12" in (out / "report.md").read_text()


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
