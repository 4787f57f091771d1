"""Run jobs under the real local supervisor (`truestep launch`) on the tiny test model and read what
they did: shared by the resilience, availability and ownership tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness import TINY, events, final_digest, loss_bits_by_step, truestep_env

MAX = 30
LIVENESS, HANG = 3.0, 4.0
COMMON = [
    f"--train.max_steps={MAX}",
    "--checkpoint.interval=5",
    "--resilience.heartbeat_interval_s=0.25",
    f"--resilience.liveness_timeout_s={LIVENESS}",
    f"--resilience.hang_timeout_s={HANG}",
    "--resilience.collective_timeout_s=20",
]
SLACK = 3.0
"""Detection latencies are asserted against the configured timeouts plus this (noisy 2-core box)."""
WARM_STANDBY = True
"""resilience.warm_standby for every supervised job; `pytest --warm-standby=off` runs them all cold."""


def standby_overrides() -> list[str]:
    return [f"--resilience.warm_standby={str(WARM_STANDBY).lower()}"]


def launch_cmd(run_dir: Path, *overrides: str, nproc: int = 2, restarts: int = 2) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "truestep",
        "launch",
        "tiny",
        f"--nproc={nproc}",
        f"--max-restarts={restarts}",
    ]
    return [*cmd, f"--run.dir={run_dir}", *TINY, *COMMON, *standby_overrides(), *overrides]


def supervise(
    run_dir: Path,
    *overrides: str,
    nproc: int = 2,
    restarts: int = 2,
    faults: str = "",
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    cmd = launch_cmd(run_dir, *overrides, nproc=nproc, restarts=restarts)
    extra = dict(env or {})
    if faults:
        extra["TRUESTEP_FAULTS"] = faults
    if extra.get("TRUESTEP_FAULTS"):
        cmd.append("--allow-env-faults")  # this test arms faults through the environment on purpose
    return subprocess.Popen(
        cmd, env=truestep_env(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(proc: subprocess.Popen, timeout: float = 240) -> int:
    """Wait for the process; its output is kept in `finish.last_output` for assertion messages."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"{proc.args} did not finish in {timeout}s:\n{out[-4000:]}") from None
    finish.last_output = out  # type: ignore[attr-defined]
    return proc.returncode


def beat(run_dir: Path, rank: int) -> dict | None:
    try:
        return json.loads((run_dir / "heartbeats" / f"rank{rank:05d}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def wait_for_step(run_dir: Path, rank: int, step: int, timeout: float = 120) -> int:
    """Wait until `rank` reports at least `step` in phase train; return its pid."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        b = beat(run_dir, rank)
        if b and b["step"] >= step and b["phase"] == "train":
            return b["pid"]
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} never reached step {step}")


def wait_for_phase(run_dir: Path, rank: int, phase: str, min_step: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        b = beat(run_dir, rank)
        if b and b["phase"] == phase and b["step"] >= min_step:
            return
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} never reported phase {phase} at step >= {min_step}")


def wait_for_event(run_dir: Path, name: str, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            found = events(run_dir, name)
        except (FileNotFoundError, json.JSONDecodeError):
            found = []
        if found:
            return found[-1]
        time.sleep(0.01)
    raise AssertionError(f"no {name} event in {run_dir} after {timeout}s")


HOLD_STEP, HOLD_S = 8, 5.0
HOLD_OVERRIDE = "--resilience.hang_timeout_s=60"
"""A test that acts on a running job (a signal, a kill) holds one rank before step HOLD_STEP for HOLD_S s
(timing only: the trajectory is unchanged) and acts once the hold has begun, so what it hits does not
depend on how fast this machine runs: after a mere heartbeat, a loaded machine could finish all 30 steps,
or reach a later pause, before the action landed. The hold stays far below this hang_timeout_s."""


def hold(rank: int = 0) -> str:
    """The fault spec of the hold on `rank`."""
    return f"sleep:at=train:step:step={HOLD_STEP}:rank={rank}:seconds={HOLD_S}"


def wait_until_held(run_dir: Path, rank: int = 0) -> int:
    """Wait until `rank` is in its hold; return its pid."""
    held = wait_for_event(run_dir, "fault_injected")
    assert (held["kind"], held["step"], held["rank"]) == ("sleep", HOLD_STEP, rank), held
    b = beat(run_dir, rank)
    assert b is not None, f"rank {rank} is held but wrote no heartbeat"
    return b["pid"]


def alive(pid: int) -> bool:
    """Running (not merely a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def supervisor_events(run: Path, name: str) -> list[dict]:
    return [e for e in events(run, name) if e.get("source") == "supervisor"]


def assert_matches_reference(run: Path, ref: Path, steps: int = MAX) -> None:
    got, want = loss_bits_by_step(run), loss_bits_by_step(ref)
    assert sorted(got) == list(range(1, steps + 1))
    assert [s for s in want if got[s] != want[s]] == []
    assert final_digest(run) == final_digest(ref)


def one_line(stderr: str) -> str:
    """The single non-empty stderr line of an expected refusal (asserting there is exactly one)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def pids_of_attempts(run: Path) -> list[int]:
    return [pid for e in supervisor_events(run, "attempt_start") for pid in e["pids"]]


def env_with(**extra: str) -> dict[str, str]:
    out = dict(os.environ)
    out.update(extra)
    return out
