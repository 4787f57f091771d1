"""`truestep launch --nnodes N --node-rank i --master-addr ...` across the namespace cluster's nodes, the way
torchrun users run multi-node without a scheduler (SLURM's daemons run, but nothing here goes through
them): a node cut off from its peers while the job moves on stands aside (fencing by incarnation), and a
slow link is not mistaken for a lost node."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from multinode import (
    TRUESTEP,
    assert_bitwise,
    events,
    job_env,
    overrides,
    supervisor,
    tail,
    timing,
)

from truestep.resilience.heartbeat import FENCE_CHECK_S
from truestep.telemetry.jsonl import read_jsonl

pytestmark = pytest.mark.slurm

PORT = 29500
"""The rendezvous port: each node has its own network stack, so no other test can hold it there."""


class Launch:
    """One launch of a job: a `truestep launch` per node, node 0 on the first of `nodes`."""

    def __init__(
        self, netns, run_dir: Path, nodes: list[str], generation: int, *extra: str, faults: str = ""
    ) -> None:
        env = job_env({"TRUESTEP_JOB_GENERATION": str(generation)})
        if faults:
            env["TRUESTEP_FAULTS"] = faults
            extra = (*extra, "--run.allow_env_faults=true")  # armed through the environment on purpose
        master = netns.addr(nodes[0])
        self.logs = [run_dir.parent / f"launch{generation}-node{i}.log" for i in range(len(nodes))]
        self.procs = [
            netns.popen(
                node,
                [
                    *TRUESTEP,
                    "launch",
                    "tiny",
                    "--nproc=1",
                    f"--nnodes={len(nodes)}",
                    f"--node-rank={i}",
                    f"--master-addr={master}",
                    f"--master-port={PORT}",
                    "--job-id=netns-launch",
                    *overrides(run_dir, *extra),
                ],
                env,
                self.logs[i],
            )  # fmt: skip
            for i, node in enumerate(nodes)
        ]

    def wait(self, timeout: float = 240) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for proc, log in zip(self.procs, self.logs, strict=True):
            try:
                codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"a launcher did not end within {timeout} s\n{tail(log)}") from None
        return codes

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)

    def output(self) -> str:
        return "\n".join(tail(log, 15) for log in self.logs)


def test_a_cut_off_node_0_stands_aside_when_the_job_moves_on(netns, multinode_reference, tmp_path):
    """Node 0 (the lease holder, rank 0) is cut off while rank 0 is inside a commit, right before its
    marker; the next launch of the job (same job id, as after a requeue) starts on two other nodes and
    takes the run directory over. The cut-off side must not publish that checkpoint or write on, and
    when its link comes back nothing of it is left; the job ends bitwise equal to an uninterrupted run."""
    reference = multinode_reference.result()
    run_dir = tmp_path / "run"
    # The cut-off side must not notice the cut by itself before the job has moved on: long timeouts.
    blind = ("--resilience.node_timeout_s=60", "--resilience.hang_timeout_s=90")
    old = Launch(
        netns, run_dir, ["n1", "n2"], 0, *blind, faults="sleep:at=save:before-marker:step=20:rank=0:seconds=8"
    )
    new = None
    try:
        netns.wait_for(lambda: events(run_dir, "fault_injected"), 150, "rank 0 to hold before the step-20 marker",
                       diagnose=old.output)  # fmt: skip
        cut = netns.partition("n1")
        new = Launch(netns, run_dir, ["n2", "n3"], 1)
        taken = netns.wait_for(
            lambda: supervisor(run_dir, "lease_taken_over"), 60, "the takeover", diagnose=new.output
        )
        moved_on = taken[0]["time"]
        timing("cut -> the next launch owns the run directory", moved_on - cut)

        codes = [proc.wait(timeout=60) for proc in old.procs]
        stood_aside = [e["time"] - moved_on for e in supervisor(run_dir, "supervisor_end", attempt=0)]
        timing(
            "job moved on -> the cut-off launchers stood aside (max)", max(stood_aside, default=float("nan"))
        )
        assert codes[0] == 5, f"cut-off node 0 exited {codes[0]}, not 5 (fenced)\n{old.output()}"
        assert codes[1] in (5, 77), f"its peer exited {codes[1]}\n{old.output()}"
        marker = run_dir / "checkpoints" / "step_00000020" / "COMMITTED"  # (the new launch resumed at 15)
        assert not marker.exists() or json.loads(marker.read_text())["incarnation"] == 1, (
            "published by the stale side"
        )
        netns.heal("n1")
        assert netns.processes("n1") == {}, "leftovers on the cut-off node after its link came back"
        assert new.wait() == [0, 0], new.output()
    finally:
        old.kill()
        if new is not None:
            new.kill()

    assert events(run_dir, "checkpoint_commit", step=20, attempt=0) == [], (
        "the stale attempt published step 20"
    )
    assert events(run_dir, "checkpoint_commit", step=20, attempt=1)
    grace = FENCE_CHECK_S + 1.0  # ranks re-check the lease every FENCE_CHECK_S; then a beat and slack
    stale = [r for r in events(run_dir) + read_jsonl(run_dir / "metrics.jsonl") if r.get("attempt") == 0]
    late = [r for r in stale if r.get("source") != "supervisor" and r["time"] > moved_on + grace]
    assert late == [], late
    assert [e for e in supervisor(run_dir) if e.get("attempt") == 0 and e["event"] != "supervisor_end"
            and e["time"] > moved_on + grace] == []  # fmt: skip
    assert supervisor(run_dir, "restart") == [], "a cut-off supervisor restarted instead of standing aside"
    assert events(run_dir, "checkpoint_restore", attempt=1)[0]["step"] == 15
    assert_bitwise(run_dir, reference)


@pytest.mark.parametrize("spec", ["delay=100,loss=1", "rate=50000"], ids=["netem-delay-loss", "tbf-rate"])
def test_a_slow_link_is_not_a_lost_node(netns, tmp_path, spec):
    """Beats and collectives crawl over a slowed link, but no node is declared lost and the job ends."""
    proc = netns.tool("slow", "n2", spec, check=False)
    if proc.returncode == 3:
        pytest.skip(f"no slow link of this kind here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "run"
    job = Launch(netns, run_dir, ["n1", "n2"], 0, "--train.max_steps=20")
    try:
        assert job.wait() == [0, 0], job.output()
    finally:
        job.kill()
    assert supervisor(run_dir, "failure_detected") == []
    assert [e["outcome"] for e in supervisor(run_dir, "supervisor_end")] == ["completed", "completed"]
    steps = [m["step_time"] for m in read_jsonl(run_dir / "metrics.jsonl")]
    timing(f"step time over a slow link ({spec}), median", sorted(steps)[len(steps) // 2])
