"""Real SLURM (one node, brought up by conftest.py): a job of scripts/slurm/train.sbatch that is requeued,
preempted or warned before its time limit comes back, resumes from a checkpoint and, for the runs that
finish, matches an uninterrupted run of the same config bit for bit.

The jobs run `truestep train` directly (TRUESTEP_CMD); the tests read the run directory and the job's
output (the sbatch script logs every signal and decision with a timestamp).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from harness import TINY, final_digest, loss_bits_by_step, truestep_env
from truestep.telemetry.jsonl import read_jsonl

# ~300 tiny steps take 15-25 s on 2 busy cores: long enough to interrupt mid-run, short enough for CI.
STEPS = int(os.environ.get("TRUESTEP_SLURM_STEPS", "300"))
TRAIN_OVERRIDES = [*TINY, "--checkpoint.interval=5"]
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
NEEDS_SIGNALS = "needs truestep signal handling (SIGTERM/SIGUSR1 -> signal_received, emergency save, exit 75)"

_bin = Path(sys.executable).with_name("truestep")
TRUESTEP = [str(_bin)] if _bin.exists() else [sys.executable, "-m", "truestep"]


def train_argv(run_dir: Path, steps: int) -> list[str]:
    return [
        *TRUESTEP,
        "train",
        "tiny",
        f"--run.dir={run_dir}",
        *TRAIN_OVERRIDES,
        f"--train.max_steps={steps}",
    ]


def timing(name: str, seconds: float) -> None:
    print(f"[tests/slurm] timing: {name}: {seconds:.1f} s", file=sys.stderr)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return f"--- {path} (tail) ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"--- {path}: not written yet ---"


def last_step(run_dir: Path) -> int:
    records = read_jsonl(run_dir / "metrics.jsonl")  # tolerates the torn last line of a live file
    return max((r["step"] for r in records), default=0)


def has_event(run_dir: Path, name: str, **match: object) -> list[dict]:
    found = [e for e in read_jsonl(run_dir / "events.jsonl") if e.get("event") == name]
    return [e for e in found if all(e.get(k) == v for k, v in match.items())]


def wait_training(slurm, run_dir: Path, out: Path, min_step: int = 20, timeout: float = 120) -> None:
    """Wait until the worker is demonstrably running: steps logged and a checkpoint committed (a signal
    sent before the process exists is lost, and a requeue before any checkpoint restarts from zero)."""
    slurm.wait_for(
        lambda: last_step(run_dir) >= min_step and has_event(run_dir, "checkpoint_commit"),
        timeout,
        f"step >= {min_step} and a committed checkpoint in {run_dir}",
        diagnose=lambda: tail(out),
    )


def submit_training(
    slurm, tmp_path: Path, name: str, steps: int, *sbatch_args: str
) -> tuple[str, Path, Path]:
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    env = truestep_env({"TRUESTEP_CMD": shlex.join(train_argv(run_dir, steps))})
    env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SBATCH_"))} | {
        "SLURM_CONF": slurm.env["SLURM_CONF"]
    }
    job = slurm.submit(
        f"--job-name=ts-{name}",
        f"--output={out}",
        f"--chdir={tmp_path}",
        *sbatch_args,
        script=slurm.train_sbatch,
        env=env,
    )
    return job, run_dir, out


def assert_bitwise(run_dir: Path, ref_dir: Path) -> None:
    got, want = loss_bits_by_step(run_dir), loss_bits_by_step(ref_dir)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1)), "steps logged differ from the reference"
    differ = [s for s in want if got[s] != want[s]]
    assert not differ, f"loss bits differ from the uninterrupted run at steps {differ[:10]}"
    assert final_digest(run_dir) == final_digest(ref_dir), "final param_digest differs from the reference"


def assert_resumed(run_dir: Path) -> list[dict]:
    restores = has_event(run_dir, "checkpoint_restore")
    assert restores, "the requeued run did not restore a checkpoint"
    first_attempt_steps = [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if m.get("attempt") == 0]
    assert first_attempt_steps and max(first_attempt_steps) < STEPS, "the first attempt was not interrupted"
    return restores


def job_start_epoch(fields: dict[str, str]) -> float:
    return datetime.fromisoformat(fields["StartTime"]).timestamp()  # scontrol prints local time


# ---------------------------------------------------------------- fixtures


class Reference:
    """The uninterrupted run, directly (not under SLURM); started in the background, awaited on use."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.log = run_dir.parent / "reference.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                train_argv(run_dir, STEPS), env=truestep_env(), stdout=log, stderr=subprocess.STDOUT
            )

    def result(self, timeout: float = 240) -> Path:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"reference run did not finish in {timeout} s\n{tail(self.log)}") from None
        assert rc == 0, f"reference run exited {rc}\n{tail(self.log)}"
        return self.run_dir

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    ref = Reference(tmp_path_factory.mktemp("reference") / "run")
    yield ref
    ref.stop()


@pytest.fixture(scope="module")
def trainer_handles_signals(tmp_path_factory: pytest.TempPathFactory) -> bool:
    """Probe the contract directly: does `truestep train` turn SIGTERM into an emergency save + exit 75?"""
    run_dir = tmp_path_factory.mktemp("signal-probe") / "run"
    proc = subprocess.Popen(
        train_argv(run_dir, 100_000), env=truestep_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while last_step(run_dir) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if proc.poll() is not None:
            return False
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=120) == 75
    except subprocess.TimeoutExpired:
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture
def signal_contract(request: pytest.FixtureRequest, trainer_handles_signals: bool) -> None:
    """Until the trainer handles SIGTERM/SIGUSR1 the signal tests still run, as expected failures."""
    if not trainer_handles_signals:
        request.node.add_marker(pytest.mark.xfail(strict=False, reason=NEEDS_SIGNALS))


# ---------------------------------------------------------------- tests


def test_scontrol_requeue_resumes_bitwise(slurm, reference, tmp_path):
    job, run_dir, out = submit_training(slurm, tmp_path, "requeue", STEPS)
    diagnose = lambda: tail(out)  # noqa: E731
    slurm.wait_job(job, lambda j: j["JobState"] == "RUNNING", 60, "RUNNING", diagnose)
    wait_training(slurm, run_dir, out)

    t0 = time.monotonic()
    slurm.run("scontrol", "requeue", job)
    slurm.wait_job(
        job, lambda j: int(j["Restarts"]) >= 1 and j["JobState"] == "RUNNING", 90, "running again", diagnose
    )
    timing("scontrol requeue -> job running again", time.monotonic() - t0)
    final = slurm.wait_job(job, lambda j: j["JobState"] in DONE, 240, "to finish", diagnose)
    timing("scontrol requeue -> training finished", time.monotonic() - t0)

    assert final["JobState"] == "COMPLETED", f"{final.get('JobState')} {final.get('ExitCode')}\n{tail(out)}"
    log = out.read_text()
    assert "SLURM is already requeueing this job" in log, tail(out)
    assert "decision: training finished" in log, tail(out)
    assert_resumed(run_dir)
    assert_bitwise(run_dir, reference.result())


def test_preemption_by_high_partition_requeues_and_resumes_bitwise(
    slurm, reference, signal_contract, tmp_path
):
    victim, run_dir, out = submit_training(slurm, tmp_path, "victim", STEPS, "--partition=debug")
    diagnose = lambda: tail(out)  # noqa: E731
    slurm.wait_job(victim, lambda j: j["JobState"] == "RUNNING", 60, "RUNNING", diagnose)
    wait_training(slurm, run_dir, out)

    t0 = time.monotonic()
    high = slurm.submit(
        "--partition=high", "--exclusive", "--job-name=ts-high", f"--output={tmp_path / 'high.out'}",
        "--wrap=sleep 2",
    )  # fmt: skip
    slurm.wait_job(victim, lambda j: int(j["Restarts"]) >= 1, 60, "preempted (Restarts >= 1)", diagnose)
    timing("high-partition submit -> victim preempted", time.monotonic() - t0)
    slurm.wait_job(
        victim,
        lambda j: int(j["Restarts"]) >= 1 and j["JobState"] == "RUNNING",
        90,
        "running again",
        diagnose,
    )
    timing("high-partition submit -> victim running again", time.monotonic() - t0)
    assert slurm.job(high).get("JobState") in {"RUNNING", "COMPLETED", "COMPLETING"}
    final = slurm.wait_job(victim, lambda j: j["JobState"] in DONE, 240, "to finish", diagnose)
    assert final["JobState"] == "COMPLETED", f"{final.get('JobState')} {final.get('ExitCode')}\n{tail(out)}"

    log = out.read_text()
    assert "received SIGTERM" in log and "-> requeued" in log, tail(out)
    restores = assert_resumed(run_dir)
    # The trainer's side of the contract: it saw the preemption, saved at the step it stopped, exited 75.
    # With SlurmctldParameters=preempt_send_user_signal SLURM sends the job's own --signal (USR1 here) on
    # preemption too, right before SIGTERM when the partition has no GraceTime: either may come first.
    signals = has_event(run_dir, "signal_received", attempt=0)
    assert signals, f"the trainer logged no signal_received event\n{tail(out)}"
    assert signals[0].get("signal") in {"SIGTERM", "SIGUSR1"}, signals[0]
    stop_step = signals[0]["stop_step"]
    assert has_event(run_dir, "checkpoint_save", attempt=0, step=stop_step), "no emergency checkpoint"
    assert "launcher exited with 75" in log, tail(out)
    assert restores[0].get("step", stop_step) == stop_step, restores[0]
    assert_bitwise(run_dir, reference.result())


def test_time_limit_warning_usr1_reaches_trainer_which_requeues_itself(slurm, signal_contract, tmp_path):
    # --signal=B:USR1@15 with --time=1: slurmctld checks limits every 30 s, so the warning arrives 15-45 s
    # before the limit (15-45 s after the start); the run is long enough never to finish first.
    lead = 15
    job, run_dir, out = submit_training(
        slurm, tmp_path, "warned", 1_000_000, "--time=1", f"--signal=B:USR1@{lead}"
    )
    diagnose = lambda: tail(out)  # noqa: E731
    running = slurm.wait_job(job, lambda j: j["JobState"] == "RUNNING", 60, "RUNNING", diagnose)
    limit = job_start_epoch(running) + 60

    slurm.wait_for_line(out, r"received SIGUSR1", 90, diagnose)
    t0 = time.monotonic()
    slurm.wait_job(
        job, lambda j: int(j["Restarts"]) >= 1 and j["JobState"] == "RUNNING", 90, "requeued itself", diagnose
    )
    timing("USR1 warning -> job running again", time.monotonic() - t0)
    slurm.wait_for(
        lambda: [e for e in has_event(run_dir, "checkpoint_restore") if e.get("attempt", 0) >= 1],
        90,
        "the requeued run to restore a checkpoint",
        diagnose=diagnose,
    )
    slurm.run("scancel", job)  # it would train (and be warned) for ever

    log = out.read_text()
    assert "decision:" in log and "requeueing (restart 1" in log, tail(out)
    signals = has_event(run_dir, "signal_received", attempt=0)
    assert signals, f"the trainer logged no signal_received event\n{tail(out)}"
    assert "USR1" in str(signals[0].get("signal")), signals[0]
    assert signals[0]["time"] < limit, f"warning at {signals[0]['time']:.1f}, after the limit {limit:.1f}"
    timing("USR1 warning before the time limit by", limit - signals[0]["time"])
    stop_step = signals[0]["stop_step"]
    assert has_event(run_dir, "checkpoint_save", attempt=0, step=stop_step), "no emergency checkpoint"
    assert "launcher exited with 75" in log and "graceful stop (exit 75)" in log, tail(out)
    restore = [e for e in has_event(run_dir, "checkpoint_restore") if e.get("attempt", 0) >= 1][0]
    assert restore.get("step", stop_step) == stop_step, restore
