"""The narration from real processes (issue 24): a supervised job that loses a rank and is then
preempted, and a single process stopped with Ctrl-C, say each recovery event as one line on stderr and
print no traceback (the peer's lost connection goes to the event log)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import TINY, events, truestep_env
from supervised import launch_cmd, wait_for_step

pytestmark = pytest.mark.multiprocess


def narrated(stderr: str) -> list[str]:
    """The narration lines (progress bars are off in these jobs; fault injections say their own)."""
    return [line for line in stderr.splitlines() if line.startswith(("truestep train:", "truestep launch:"))]


def test_a_lost_rank_then_a_preemption_are_narrated_one_line_each(tmp_path: Path) -> None:
    faults = "kill:rank=1:step=12;term:step=16:restart=1"
    cmd = launch_cmd(tmp_path, "--train.max_steps=20", "--checkpoint.interval=5", restarts=1)
    cmd.append("--allow-env-faults")  # the faults are armed through the environment on purpose
    proc = subprocess.run(
        cmd, env=truestep_env({"TRUESTEP_FAULTS": faults}), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 75, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    lines = narrated(proc.stderr)
    stop = events(tmp_path, "signal_received")[-1]["stop_step"]
    restored = events(tmp_path, "checkpoint_restore")[-1]

    def one(start: str) -> str:
        found = [line for line in lines if line.startswith(start)]
        assert len(found) == 1, (start, proc.stderr[-4000:])
        return found[0]

    assert one("truestep launch: failure detected: process_exit on rank 1 after ")
    assert one("truestep launch: restarting as attempt 1 (restart 1 after process_exit on rank 1; ")
    resumed = one(f"truestep train: resuming from step {restored['step']} ({restored['path']}; verified by ")
    assert one("truestep train: back at work: step ") and "after the failure was detected" in "".join(lines)
    assert one(f"truestep train: preempted (SIGTERM) at step {stop}: saving a checkpoint, then exit 75")
    assert one(f"truestep train: saved step {stop} ")
    assert one("truestep launch: exit 75 (requeue me): preempted, checkpoint saved")
    quarantined = events(tmp_path, "checkpoint_quarantined")
    if quarantined:  # the kill landed while step 5's save was in flight: the fall-back is said too
        assert one(f"truestep train: quarantined checkpoint step {quarantined[0]['step']} (")
        assert f"fell back past quarantined step {quarantined[0]['step']}" in resumed
    # The surviving rank's broken collective: one line here, its traceback in the event log.
    failed = events(tmp_path, "run_failed")
    assert all("Traceback" in e["traceback"] for e in failed)
    # Said as another rank's failure, by the rank that says it, never as a network fault. The rank writes
    # its event first and its line after: the supervisor's teardown (SIGKILL) may end it in between.
    echoes = [line for line in lines if "another rank of this job failed" in line]
    assert len(echoes) <= len(failed) and all(line.startswith("truestep train: rank ") for line in echoes)
    assert not any("Connection" in line or "peer" in line for line in lines), lines


def test_ctrl_c_is_narrated_saved_then_exit_130(tmp_path: Path) -> None:
    args = ["train", "tiny", f"--run.dir={tmp_path}", *TINY, "--train.max_steps=100000"]
    args += ["--checkpoint.interval=0", "--resilience.heartbeat_interval_s=0.2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "truestep", *args],
        env=truestep_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_step(tmp_path, 0, 3)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-4000:]
    stop = events(tmp_path, "signal_received")[-1]["stop_step"]
    assert narrated(stderr) == [
        f"truestep train: interrupted (SIGINT) at step {stop}: saving a checkpoint, then exit 130",
        f"truestep train: saved step {stop} (committed and verifiable)",
        f"truestep train: exit 130: interrupted at step {stop}, saved; run the same command again to resume",
    ], stderr[-4000:]
    assert "Traceback" not in stderr and "torch.distributed is disabled" not in stderr, stderr[-4000:]


def test_a_corrupted_checkpoint_is_narrated_quarantined_then_fallen_back_past(tmp_path: Path) -> None:
    """`corrupt` flips a byte in the newest committed checkpoint, then kills rank 0: the restart's
    verification quarantines it and resumes from an older one, and says both."""
    # Synchronous saves: step 10 is committed before step 11, so the fault at 14 damages step 10 whatever
    # this machine's speed (async, a write still running at 14 would leave 10 torn and 5 damaged).
    cmd = launch_cmd(
        tmp_path,
        "--train.max_steps=20",
        "--checkpoint.interval=5",
        "--checkpoint.async_save=false",
        restarts=1,
    )
    cmd.append("--allow-env-faults")  # the fault is armed through the environment on purpose
    env = truestep_env({"TRUESTEP_FAULTS": "corrupt:step=14"})
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    lines = narrated(proc.stderr)
    quarantined = events(tmp_path, "checkpoint_quarantined")
    restored = events(tmp_path, "checkpoint_restore")[-1]
    assert quarantined and restored["step"] < quarantined[-1]["step"], (quarantined, restored)
    said = [line for line in lines if line.startswith("truestep train: quarantined checkpoint step ")]
    assert said == [
        f"truestep train: quarantined checkpoint step {q['step']} ({q['reason']}); moved to {q['moved_to']}"
        for q in quarantined
    ]
    past = ", ".join(str(q["step"]) for q in quarantined)
    resumed = [line for line in lines if line.startswith("truestep train: resuming from step ")]
    assert resumed == [
        f"truestep train: resuming from step {restored['step']} ({restored['path']}; verified by commit marker "
        f"and manifest; every shard item's SHA-256 as it loads, in {resumed[0].split(' loads, in ')[1].split(' s;')[0]} s; loaded in "
        f"{restored['restore_s']:.1f} s); fell back past quarantined step {past}"
    ], proc.stderr[-4000:]
    assert lines[-1] == "truestep launch: finished after 1 restart(s)", proc.stderr[-4000:]


def test_ctrl_c_under_launch_is_narrated_by_the_rank_and_the_supervisor(tmp_path: Path) -> None:
    cmd = launch_cmd(tmp_path, "--train.max_steps=100000", "--checkpoint.interval=0", restarts=1)
    proc = subprocess.Popen(
        cmd, env=truestep_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for_step(tmp_path, 0, 3)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-4000:]
    stop = events(tmp_path, "signal_received")[-1]["stop_step"]
    lines = narrated(stderr)
    assert lines[0].startswith("truestep train: interrupted (") and lines[0].endswith(
        f" at step {stop}: saving a checkpoint, then exit 130"
    ), stderr[-4000:]
    assert lines[1:] == [
        f"truestep train: saved step {stop} (committed and verifiable)",
        "truestep launch: exit 130: interrupted, checkpoint saved; run the same command again to resume",
    ], stderr[-4000:]
    assert "Traceback" not in stderr, stderr[-4000:]
