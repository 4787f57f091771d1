"""Shared by the multi-node tests on the namespace cluster: the job every test runs (the tiny model, one
rank per node), submitting it, reading what each node's supervisor logged, and the checks every
multi-node run must pass (one attempt number per attempt on every node, `node` and `host` on every
supervisor event)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from slurmtools import BackgroundRun, tail

from harness import TINY, bits, final_digest, truestep_env
from truestep.telemetry.jsonl import read_jsonl

STEPS = int(os.environ.get("TRUESTEP_MULTINODE_STEPS", "60"))
"""Long enough to interrupt after a committed checkpoint, short enough for CI (a few seconds of steps)."""
INTERVAL = 5
DETECT_CRASH_S = 3.0
"""The issue's bound: surviving nodes notice a crashed node within 3 s."""

_bin = Path(sys.executable).with_name("truestep")
TRUESTEP = [str(_bin)] if _bin.exists() else [sys.executable, "-m", "truestep"]


def overrides(run_dir: Path, *extra: str) -> list[str]:
    return [
        f"--run.dir={run_dir}",
        *TINY,
        f"--train.max_steps={STEPS}",
        f"--checkpoint.interval={INTERVAL}",
        *extra,
    ]


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a job runs with: no SLURM or TRUESTEP leftovers of the caller; gloo bound to the
    node's own interface (node hostnames do not resolve here, so gloo would pick loopback)."""
    env = {k: v for k, v in truestep_env().items() if not k.startswith(("SLURM_", "SBATCH_", "TRUESTEP_"))}
    env["GLOO_SOCKET_IFNAME"] = "eth0"
    env.update(extra or {})
    return env


def submit(
    cluster, tmp_path: Path, name: str, *sbatch_args: str, extra: tuple[str, ...] = (), faults: str = ""
) -> tuple[str, Path, Path]:
    """train.sbatch with its default command (`truestep launch tiny --nproc 1` on every node); `faults`
    armed on every node through the environment (TRUESTEP_FAULTS, docs/faults.md)."""
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    env = job_env({"SLURM_CONF": cluster.env["SLURM_CONF"]})
    if faults:
        env["TRUESTEP_FAULTS"] = faults
        extra = (*extra, "--run.allow_env_faults=true")
    script_args: tuple[str, ...] = tuple(overrides(run_dir, *extra))
    if len(TRUESTEP) == 1:
        env.update(TRUESTEP_BIN=TRUESTEP[0], TRUESTEP_CONFIG="tiny", TRUESTEP_NPROC="1")
    else:
        env["TRUESTEP_CMD"] = shlex.join([*TRUESTEP, "launch", "tiny", "--nproc", "1"])
    job = cluster.submit(
        f"--job-name=ts-{name}", f"--output={out}", f"--chdir={tmp_path}", *sbatch_args,
        script=cluster.train_sbatch, script_args=script_args, env=env,
    )  # fmt: skip
    return job, run_dir, out


def events(run_dir: Path, name: str | None = None, **match: object) -> list[dict]:
    found = read_jsonl(run_dir / "events.jsonl")  # tolerates the torn last line of a live file
    found = [e for e in found if name is None or e.get("event") == name]
    return [e for e in found if all(e.get(k) == v for k, v in match.items())]


def supervisor(run_dir: Path, name: str | None = None, **match: object) -> list[dict]:
    return events(run_dir, name, source="supervisor", **match)


def last_step(run_dir: Path) -> int:
    return max((m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")), default=0)


def wait_training(cluster, run_dir: Path, out: Path, min_step: int = 15, timeout: float = 150) -> None:
    """Until steps are logged and a checkpoint committed: a fault before that would restart from zero."""
    cluster.wait_for(
        lambda: last_step(run_dir) >= min_step and events(run_dir, "checkpoint_commit"),
        timeout,
        f"step >= {min_step} and a committed checkpoint in {run_dir}",
        diagnose=lambda: tail(out),
    )


def record_fault(run_dir: Path, at: float, kind: str, spec: str, **fields: object) -> None:
    """What the fault tools did, in the run's own event log (one O_APPEND line), so the instrument
    measures detection and recovery from the true fault time: kind=kill + scope=node is a node crash."""
    attempt = max((e["attempt"] for e in supervisor(run_dir, "attempt_start")), default=0)
    record = {"time": at, "source": "fault", "event": "fault_injected", "kind": kind, "spec": spec,
              "point": "external", "attempt": attempt, "step": last_step(run_dir), **fields}  # fmt: skip
    with open(run_dir / "events.jsonl", "a") as log:
        log.write(json.dumps(record) + "\n")


def assert_job_wide_attempts(run_dir: Path, nodes_per_attempt: dict[int, int]) -> None:
    """Every supervisor event names its node and host; each attempt was started on exactly its nodes,
    under one number; every rank record of an attempt carries that attempt's number."""
    sup = supervisor(run_dir)
    assert sup and all(isinstance(e.get("node"), int) and e.get("host") for e in sup), [
        e for e in sup if not isinstance(e.get("node"), int) or not e.get("host")
    ]
    started: dict[int, list[int]] = {}
    for e in supervisor(run_dir, "attempt_start"):
        started.setdefault(e["attempt"], []).append(e["node"])
    want = {a: list(range(n)) for a, n in nodes_per_attempt.items()}
    assert {a: sorted(n) for a, n in started.items()} == want, started
    ranks = {e["attempt"] for e in events(run_dir) if e.get("source") != "supervisor" and "attempt" in e}
    ranks |= {m["attempt"] for m in read_jsonl(run_dir / "metrics.jsonl")}
    assert ranks <= set(want), f"records of attempts {sorted(ranks - set(want))} no supervisor started"


def loss_bits(run_dir: Path) -> dict[int, str]:
    """step -> loss bit pattern; a step computed twice (before and after a failure) keeps the last."""
    return {m["step"]: bits(m["loss"]) for m in read_jsonl(run_dir / "metrics.jsonl")}


def assert_bitwise(run_dir: Path, ref_dir: Path) -> None:
    got, want = loss_bits(run_dir), loss_bits(ref_dir)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1)), "steps logged differ from the reference"
    differ = [s for s in want if got[s] != want[s]]
    assert not differ, f"loss bits differ from the uninterrupted run at steps {differ[:10]}"
    assert final_digest(run_dir) == final_digest(ref_dir), "final param_digest differs from the reference"


def timing(name: str, seconds: float) -> None:
    load = os.getloadavg()[0]
    print(f"[tests/slurm] timing: {name}: {seconds:.2f} s (load {load:.1f})", file=sys.stderr)


class Reference(BackgroundRun):
    """The uninterrupted run with the same layout (2 ranks: FSDP x2), on this host, not under SLURM;
    started in the background, awaited on use. Two nodes x one rank are bitwise equal to it."""

    def __init__(self, run_dir: Path) -> None:
        cmd = [*TRUESTEP, "launch", "tiny", "--nproc", "2", *overrides(run_dir)]
        super().__init__(run_dir, cmd, job_env(), timeout=300)
