"""The instrument on real runs (tiny model, one process): the cases issue 11 names that need a real
trainer, checkpoints and the emulator.

- A resume without the optimizer state logs bitwise-equal losses; only the parameters show it, and the
  verdict must (exit 1), while the correct resume stays bitwise (exit 0).
- A resume that changes train.micro_batch_size is refused (it is part of the trajectory fingerprint).
- Under the emulator two same-seed runs differ, and zeroed moments are seen in the optimizer state at
  the first checkpoint after the resume, before the loss can show them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness import events, launch, loss_bits_by_step, truestep_env
from truestep.analysis.floor import measure_floor
from truestep.analysis.runlog import RunLog
from truestep.analysis.summary import analyze_run
from truestep.analysis.verdict import Status

pytestmark = pytest.mark.multiprocess

MAX, STOP = 6, 5
COMMON = [f"--train.max_steps={MAX}", "--checkpoint.interval=2", "--checkpoint.keep_last_n=0"]
NOISE = "--train.emulate_nondeterminism=1e-3"
STATE_KINDS = {"params", "exp_avg", "exp_avg_sq", "step"}


def fidelity(run: Path, ref: Path, *floors: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "truestep", "fidelity", str(run), "--reference", str(ref)]
    cmd += [f"--floor={f}" for f in floors]
    return subprocess.run(cmd, env=truestep_env(), capture_output=True, text=True, timeout=240)


def stop_and_resume(run: Path, *resume: str, extra: tuple[str, ...] = ()) -> Path:
    launch(run, *COMMON, *extra, f"--train.stop_at_step={STOP}")
    launch(run, *COMMON, *extra, *resume)
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("instrument")
    jobs = {
        "ref": lambda p: launch(p, *COMMON),
        "stopped": lambda p: launch(p, *COMMON, f"--train.stop_at_step={STOP}"),
        "noisy-ref": lambda p: launch(p, *COMMON, NOISE),
        "noisy-1": lambda p: launch(p, *COMMON, NOISE),
        "noisy-2": lambda p: launch(p, *COMMON, NOISE),
        "noisy-opt-off": lambda p: stop_and_resume(
            p, "--checkpoint.restore_optimizer_state=false", extra=(NOISE,)
        ),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(job, base / name) for name, job in jobs.items()}
        for future in futures.values():
            future.result()
    return {name: base / name for name in jobs}


def resumed_copy(runs: dict[str, Path], dest: Path, *switches: str, check: bool = True):
    shutil.copytree(runs["stopped"], dest)
    return launch(dest, *COMMON, *switches, check=check)


def test_equal_losses_with_zeroed_moments_fail_on_the_parameters(runs, tmp_path: Path) -> None:
    """Issue 11, hole 2: every logged loss is bitwise equal, the parameters are not."""
    run = tmp_path / "opt-off"
    resumed_copy(runs, run, "--checkpoint.restore_optimizer_state=false")
    assert loss_bits_by_step(run) == loss_bits_by_step(runs["ref"])
    proc = fidelity(run, runs["ref"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"{run}: VIOLATED at step {MAX}"), proc.stdout


def test_the_correct_resume_is_bitwise_parameters_included(runs, tmp_path: Path) -> None:
    run = tmp_path / "all-on"
    resumed_copy(runs, run)
    result = analyze_run("all-on", RunLog.load(run), RunLog.load(runs["ref"]), None)
    assert result.verdict.status is Status.BITWISE, result.verdict
    steps = [d.step for d in result.comparison.state]
    assert steps == [2, 4, 6] and all(v == 0.0 for d in result.comparison.state for v in d.totals.values())
    assert fidelity(run, runs["ref"]).returncode == 0


def test_a_resume_that_changes_the_micro_batch_is_refused(runs, tmp_path: Path) -> None:
    """Issue 11, hole 7: train.micro_batch_size shapes the trajectory, so it is in the fingerprint."""
    proc = resumed_copy(runs, tmp_path / "micro", "--train.micro_batch_size=4", check=False)
    assert proc.returncode == 3, proc.stderr
    assert "train.micro_batch_size: 0 -> 4" in proc.stderr


def test_the_emulator_makes_same_seed_runs_differ(runs) -> None:
    ref, a, b = (RunLog.load(runs[n]) for n in ("noisy-ref", "noisy-1", "noisy-2"))
    floor = measure_floor(ref, [a, b])
    assert not floor.bitwise and 0 < floor.max_dloss < 1e-3
    assert floor.state_steps == [2, 4, 6]
    params = floor.families["params"]
    assert params.calibrated and all(v > 0 for v in params.envelope.values)
    # Without the emulator the same seed is bitwise: the noise comes from the emulator alone. (The saved
    # weights' digests, not the losses: Adam's first steps all but cancel a relative gradient noise, so
    # six float32 losses can come out equal.)
    saved = {n: [e["param_digest"] for e in events(runs[n], "checkpoint_save")] for n in ("ref", "noisy-ref")}
    assert saved["ref"][-1] != saved["noisy-ref"][-1], saved


def test_zeroed_moments_show_in_the_state_before_the_loss(runs) -> None:
    """Resumed at step 5 without the optimizer state, under emulated noise: at the first checkpoint after
    the resume (step 6) exp_avg is far outside the floor, while no logged loss is (the loss of step 6 was
    computed before the bad update). The bounds are loose (x100, x10) so that the noise cannot decide."""
    ref = RunLog.load(runs["noisy-ref"])
    floor = measure_floor(ref, [RunLog.load(runs["noisy-1"]), RunLog.load(runs["noisy-2"])])
    result = analyze_run("opt-off", RunLog.load(runs["noisy-opt-off"]), ref, floor)
    exp_avg = floor.families["exp_avg"]
    limit = {s: exp_avg.tau * v for s, v in zip(exp_avg.envelope.steps, exp_avg.envelope.values, strict=True)}
    seen = {d.step: d.totals["exp_avg"] for d in result.comparison.state}
    assert seen[MAX] > 100 * limit[MAX], (seen, limit)
    assert all(seen[s] < 10 * limit[s] for s in (2, 4)), (seen, limit)
    assert result.comparison.max_dloss < 10 * floor.max_dloss
    assert result.verdict.status is Status.VIOLATED and result.verdict.first_violation_step <= MAX
