"""Real SLURM (one node, brought up by conftest.py): a job of scripts/slurm/train.sbatch that is requeued,
preempted or warned before its time limit comes back, resumes from a checkpoint and, for the runs that
finish, matches an uninterrupted run of the same config bit for bit.

The requeue test runs `truestep train` through TRUESTEP_CMD; the preemption and time-limit tests run the
script's default command, `truestep launch` (the supervisor, which forwards signals to its rank). The
tests read the run directory and the job's output, where the sbatch script logs every signal and
decision with a timestamp.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from slurmtools import BackgroundRun, tail

import supervised
from harness import TINY, final_digest, loss_bits_by_step, truestep_env
from truestep.resilience.heartbeat import read_heartbeat
from truestep.telemetry.jsonl import read_jsonl

pytestmark = pytest.mark.slurm

# ~300 tiny steps take 15-25 s on 2 busy cores: long enough to interrupt mid-run, short enough for CI.
STEPS = int(os.environ.get("TRUESTEP_SLURM_STEPS", "300"))
TRAIN_OVERRIDES = [*TINY, "--checkpoint.interval=5"]
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}

_bin = Path(sys.executable).with_name("truestep")  # .venv/bin/truestep
TRUESTEP = [str(_bin)] if _bin.exists() else [sys.executable, "-m", "truestep"]


def overrides(run_dir: Path, steps: int, extra: tuple[str, ...] = ()) -> list[str]:
    standby = supervised.standby_overrides()  # pytest --warm-standby=off: every launcher runs cold
    return [f"--run.dir={run_dir}", *TRAIN_OVERRIDES, *standby, f"--train.max_steps={steps}", *extra]


def timing(name: str, seconds: float) -> None:
    print(f"[tests/slurm] timing: {name}: {seconds:.1f} s", file=sys.stderr)


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
    slurm,
    tmp_path: Path,
    name: str,
    steps: int,
    *sbatch_args: str,
    launcher: str,
    extra: tuple[str, ...] = (),
    faults: str = "",
) -> tuple[str, Path, Path]:
    """Submit train.sbatch for the tiny model. launcher="train": TRUESTEP_CMD runs `truestep train`;
    launcher="launch": the script's default command (`truestep launch tiny --nproc 1`, overrides as
    the script's arguments). `extra` overrides are appended; `faults` become TRUESTEP_FAULTS."""
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    env = {k: v for k, v in truestep_env().items() if not k.startswith(("SLURM_", "SBATCH_", "TRUESTEP_"))}
    env["SLURM_CONF"] = slurm.env["SLURM_CONF"]
    if faults:
        env["TRUESTEP_FAULTS"] = faults
        extra = (*extra, "--run.allow_env_faults=true")  # armed through the environment on purpose
    script_args: tuple[str, ...] = ()
    if launcher == "train":
        env["TRUESTEP_CMD"] = shlex.join([*TRUESTEP, "train", "tiny", *overrides(run_dir, steps, extra)])
    elif len(TRUESTEP) == 1:
        env.update(TRUESTEP_BIN=TRUESTEP[0], TRUESTEP_CONFIG="tiny", TRUESTEP_NPROC="1")
        script_args = tuple(overrides(run_dir, steps, extra))
    else:
        env["TRUESTEP_CMD"] = shlex.join(
            [*TRUESTEP, "launch", "tiny", "--nproc", "1", *overrides(run_dir, steps, extra)]
        )
    job = slurm.submit(
        f"--job-name=ts-{name}",
        f"--output={out}",
        f"--chdir={tmp_path}",
        *sbatch_args,
        script=slurm.train_sbatch,
        script_args=script_args,
        env=env,
    )
    return job, run_dir, out


def assert_bitwise(run_dir: Path, ref_dir: Path) -> None:
    got, want = loss_bits_by_step(run_dir), loss_bits_by_step(ref_dir)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1)), "steps logged differ from the reference"
    differ = [s for s in want if got[s] != want[s]]
    assert not differ, f"loss bits differ from the uninterrupted run at steps {differ[:10]}"
    assert final_digest(run_dir) == final_digest(ref_dir), "final param_digest differs from the reference"


def first_attempt_steps(run_dir: Path) -> list[int]:
    return [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if m.get("attempt") == 0]


def restores_after_first_attempt(run_dir: Path) -> list[dict]:
    return [e for e in has_event(run_dir, "checkpoint_restore") if e.get("attempt", 0) >= 1]


def assert_graceful_stop(run_dir: Path, out: Path, signals_ok: set[str]) -> dict:
    """The trainer's side of the contract in the first attempt: it logged the signal, saved at the step
    it stopped at, the launcher exited 75, and the next attempt restored exactly that checkpoint."""
    seen = has_event(run_dir, "signal_received", attempt=0)
    assert seen, f"the trainer logged no signal_received event\n{tail(out)}"
    assert seen[0].get("signal") in signals_ok, seen[0]
    stop_step = seen[0]["stop_step"]
    assert max(first_attempt_steps(run_dir)) == stop_step, "the first attempt went on after it stopped"
    assert has_event(run_dir, "checkpoint_save", attempt=0, step=stop_step), "no emergency checkpoint"
    assert "launcher exited with 75" in out.read_text(), tail(out)
    restores = restores_after_first_attempt(run_dir)
    assert restores and restores[0].get("step") == stop_step, restores[:1]
    return seen[0]


# ---------------------------------------------------------------- fixtures


class Reference(BackgroundRun):
    """The uninterrupted run, directly (not under SLURM); started in the background, awaited on use."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(
            run_dir, [*TRUESTEP, "train", "tiny", *overrides(run_dir, STEPS)], truestep_env(), 240
        )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    ref = Reference(tmp_path_factory.mktemp("reference") / "run")
    yield ref
    ref.stop()


# ---------------------------------------------------------------- tests


def test_scontrol_requeue_resumes_bitwise(slurm, reference, tmp_path):
    job, run_dir, out = submit_training(slurm, tmp_path, "requeue", STEPS, launcher="train")
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
    assert "-> requeued" in log and "SLURM is already requeueing this job" in log, tail(out)
    assert "decision: training finished" in log, tail(out)
    assert max(first_attempt_steps(run_dir)) < STEPS, "the first attempt was not interrupted"
    assert restores_after_first_attempt(run_dir), "the requeued run did not restore a checkpoint"
    assert_bitwise(run_dir, reference.result())


def test_preemption_by_high_partition_requeues_and_resumes_bitwise(slurm, reference, tmp_path):
    victim, run_dir, out = submit_training(
        slurm, tmp_path, "victim", STEPS, "--partition=debug", launcher="launch"
    )
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
    assert slurm.job(high).get("JobState") in {"RUNNING", "COMPLETING", "COMPLETED"}
    final = slurm.wait_job(victim, lambda j: j["JobState"] in DONE, 240, "to finish", diagnose)
    assert final["JobState"] == "COMPLETED", f"{final.get('JobState')} {final.get('ExitCode')}\n{tail(out)}"

    log = out.read_text()
    assert "DUE TO PREEMPTION" in log, tail(out)
    assert "received SIGTERM" in log and "-> requeued" in log, tail(out)
    # With SlurmctldParameters=preempt_send_user_signal SLURM also sends the job's own --signal (USR1 here)
    # on preemption, right before SIGTERM when the partition has no GraceTime: either may arrive first.
    assert_graceful_stop(run_dir, out, {"SIGTERM", "SIGUSR1"})
    assert_bitwise(run_dir, reference.result())


def test_time_limit_warning_usr1_reaches_trainer_which_requeues_itself(slurm, tmp_path):
    # --time=1 with --signal=B:USR1@10: slurmctld looks at limits every 30 s, so the warning comes 10-40 s
    # before the limit, i.e. 20-50 s after the start (later than a loaded machine needs to start the
    # trainer: a USR1 before its handler exists kills it). The run never finishes on its own; its steps
    # are paced (`slow`: each step sleeps 4x its own time, no numerics change) so that the 20-50 s of
    # waiting do not keep a core busy.
    job, run_dir, out = submit_training(
        slurm,
        tmp_path,
        "warned",
        1_000_000,
        "--time=1",
        "--signal=B:USR1@10",
        launcher="launch",
        faults="slow:factor=5",
    )
    diagnose = lambda: tail(out)  # noqa: E731
    running = slurm.wait_job(job, lambda j: j["JobState"] == "RUNNING", 60, "RUNNING", diagnose)
    limit = datetime.fromisoformat(running["StartTime"]).timestamp() + 60  # scontrol prints local time

    slurm.wait_for_line(out, r"received SIGUSR1", 90, diagnose)
    t0 = time.monotonic()
    # Give the requeued run a long limit, so its own warning cannot race its start-up and restore.
    slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=10")
    slurm.wait_job(
        job, lambda j: int(j["Restarts"]) >= 1 and j["JobState"] == "RUNNING", 90, "requeued itself", diagnose
    )
    timing("USR1 warning -> job running again", time.monotonic() - t0)
    slurm.wait_for(
        lambda: restores_after_first_attempt(run_dir), 90, "the requeued run to restore", diagnose=diagnose
    )
    slurm.run("scancel", job)  # it would train for ever

    log = out.read_text()
    # (On a very slow machine the limit may strike while the trainer is still stopping: still fine.)
    assert re.search(r"graceful stop \(exit 75\)( at the time limit)?; requeueing \(restart 1", log), tail(
        out
    )
    assert has_event(run_dir, "supervisor_signal", signal="SIGUSR1"), "the launcher never got SIGUSR1"
    seen = assert_graceful_stop(run_dir, out, {"SIGUSR1"})
    assert seen["time"] < limit, (
        f"the trainer saw the warning at {seen['time']:.1f}, after the limit {limit:.1f}"
    )
    timing("trainer saw USR1 before the time limit by", limit - seen["time"])


# ---------------------------------------------------------------- warm standby under SLURM

# Rank 0 stalls at step 100 of the first attempt; the test kills it there. A sleep changes no numerics,
# and the hang timeout leaves room for it.
STALL = ("sleep:at=train:step:step=100:rank=0:seconds=300", ("--resilience.hang_timeout_s=600",))


def standby_events(run_dir: Path, name: str) -> list[dict]:
    return [e for e in has_event(run_dir, name) if e.get("source") == "supervisor"]


def parked_standby(slurm, run_dir: Path, out: Path) -> dict:
    """The node's warm template once it is ready and rank 0 (which it forked) trains."""
    ready = slurm.wait_for(
        lambda: next(iter(standby_events(run_dir, "standby_ready")), None),
        180,
        f"a ready standby in {run_dir}",
        diagnose=lambda: tail(out),
    )
    slurm.wait_for(
        lambda: (
            (beat := read_heartbeat(run_dir / "heartbeats" / "rank00000.json")) and beat["phase"] == "train"
        ),
        180,
        f"rank 0 training in {run_dir}",
        diagnose=lambda: tail(out),
    )
    return ready


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


@pytest.mark.skipif("not supervised.WARM_STANDBY", reason="pytest --warm-standby=off")
def test_a_killed_rank_restarts_through_its_warm_standby_under_slurm(slurm, reference, tmp_path):
    faults, extra = STALL
    job, run_dir, out = submit_training(
        slurm, tmp_path, "standby", STEPS, launcher="launch", extra=extra, faults=faults
    )
    diagnose = lambda: tail(out)  # noqa: E731
    slurm.wait_job(job, lambda j: j["JobState"] == "RUNNING", 60, "RUNNING", diagnose)
    standby = parked_standby(slurm, run_dir, out)
    rank = json.loads((run_dir / "heartbeats" / "rank00000.json").read_text())["pid"]
    t0 = time.monotonic()
    os.kill(rank, signal.SIGKILL)
    final = slurm.wait_job(job, lambda j: j["JobState"] in DONE, 240, "to finish", diagnose)
    timing("rank SIGKILL -> job finished (in-place restart through the standby)", time.monotonic() - t0)
    assert final["JobState"] == "COMPLETED", f"{final.get('JobState')} {final.get('ExitCode')}\n{tail(out)}"
    assert final.get("Restarts") == "0", "SLURM requeued the job: the restart was not in place"
    # Both attempts' rank was forked by the one template; the restart's from a ready one.
    first, handoff = standby_events(run_dir, "standby_handoff")
    assert {first["template"], handoff["template"]} == {standby["pid"]} and handoff["ready"], handoff
    assert standby_events(run_dir, "attempt_start")[1]["pids"] == [handoff["pid"]]
    assert_bitwise(run_dir, reference.result())
    spawned = [e["pid"] for e in standby_events(run_dir, "standby_spawned")]
    slurm.wait_for(lambda: all(gone(p) for p in spawned), 10, "the job's warm template to be gone")


@pytest.mark.skipif("not supervised.WARM_STANDBY", reason="pytest --warm-standby=off")
def test_a_parked_standby_does_not_outlive_a_cancelled_job(slurm, tmp_path):
    faults, extra = STALL
    job, run_dir, out = submit_training(
        slurm, tmp_path, "standby-cancel", STEPS, launcher="launch", extra=extra, faults=faults
    )
    slurm.wait_job(job, lambda j: j["JobState"] == "RUNNING", 60, "RUNNING", lambda: tail(out))
    standby = parked_standby(slurm, run_dir, out)["pid"]
    rank = json.loads((run_dir / "heartbeats" / "rank00000.json").read_text())["pid"]
    assert not gone(standby) and not gone(rank)
    slurm.run("scancel", job)
    slurm.wait_job(job, lambda j: j["JobState"] in DONE, 60, "cancelled", lambda: tail(out))
    slurm.wait_for(lambda: gone(standby) and gone(rank), 15, "the standby and the rank to be gone")
