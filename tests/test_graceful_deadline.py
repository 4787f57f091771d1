"""The graceful stop fits the job: the forced-exit deadline grows with the measured step and save times
(resilience.exit_deadline_multiple, like the hang allowance), and a preemption signal that comes while a
rank is still starting ends it before its first step (exit 75, nothing to save) instead of after a step,
a save and possibly the forced exit."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import TINY, events, run_in_process, truestep_env
from truestep.config.schema import ResilienceConfig
from truestep.resilience import early_signals
from truestep.telemetry.run_logs import RunLogs


def test_the_allowance_grows_with_the_longest_step_and_save() -> None:
    r = ResilienceConfig()
    assert r.exit_allowance(110.0, 20.0) == (
        260.0,
        "resilience.exit_deadline_multiple=2 x (the longest step, 110.0s, + the longest save, 20.0s)",
    )
    assert r.exit_allowance(1.0, 2.0) == (90.0, "resilience.exit_deadline_s=90")
    r.exit_deadline_multiple = 0.0
    assert r.exit_allowance(110.0, 20.0)[0] == 90.0


def test_every_rank_remembers_its_longest_save_even_without_logs(tmp_path: Path) -> None:
    logs = RunLogs(tmp_path, attempt=0, enabled=False)  # a rank other than 0 writes nothing
    assert logs.longest_save_s() == 0.0
    logs.event("checkpoint_written", step=2, write_s=3.0)
    logs.event("checkpoint_commit", step=2, commit_s=0.5)
    logs.event("checkpoint_written", step=4, write_s=1.0)
    logs.event("checkpoint_restore", step=4, write_s=99.0)  # not a save
    assert logs.longest_save_s() == 3.5 and not (tmp_path / "events.jsonl").exists()


def test_a_run_says_when_its_graceful_stop_no_longer_fits_the_schedulers_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = ["--train.max_steps=3", "--schedule.warmup_steps=1", "--checkpoint.interval=1"]
    tight = ["--resilience.exit_deadline_s=1", "--resilience.scheduler_lead_time_s=2"]
    assert run_in_process(tmp_path, *job, *tight, "--resilience.exit_deadline_multiple=10000") == 0
    (said,) = events(tmp_path, "exit_deadline_beyond_lead_time")  # once, however many steps follow
    assert said["deadline_s"] > 2 and "exit_deadline_multiple=10000" in said["rule"]
    warned = [line for line in capsys.readouterr().err.splitlines() if "a graceful stop may now take" in line]
    assert len(warned) == 1 and "SLURM --signal=TERM@N" in warned[0], warned
    assert run_in_process(tmp_path / "fits", *job, *tight, "--resilience.exit_deadline_multiple=0") == 0
    assert not events(tmp_path / "fits", "exit_deadline_beyond_lead_time")


def test_a_signal_recorded_during_start_up_stops_before_the_first_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    early_signals.pending.append(("SIGTERM", time.time()))  # as `capture()` records one during imports
    try:
        assert run_in_process(tmp_path, "--train.max_steps=3") == 75
    finally:
        early_signals.pending.clear()
    err = capsys.readouterr().err
    assert "stopped by SIGTERM during start-up (before building the model), before any step" in err
    [said] = events(tmp_path, "signal_received")
    assert (said["stop_step"], said["stop_reason"], said["during_startup"]) == (
        0,
        "preempted",
        "before building the model",
    )
    assert not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text()
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.multiprocess
def test_a_real_sigterm_at_spawn_ends_the_rank_promptly_with_75(tmp_path: Path) -> None:
    """Sent the instant the process exists (held pending until the rank's first act, as under the
    supervisor): exit 75 before any step, far inside the 90 s deadline it used to wait for."""
    cmd = [sys.executable, "-m", "truestep", "train", "tiny", f"--run.dir={tmp_path}", *TINY]
    with early_signals.held_for_child():
        proc = subprocess.Popen(cmd, env=truestep_env(), stderr=subprocess.PIPE, text=True)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert "stopped by SIGTERM during start-up" in err and time.monotonic() - sent < 60
    assert not (tmp_path / "checkpoints").exists()
