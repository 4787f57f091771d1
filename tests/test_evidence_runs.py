"""Issue 29 on real runs (the tiny model, real checkpoints, the emulator): the cases whose shape only a
real trainer makes. A floor mixing layouts, the reference given as its own floor, a reference stopped
early and a nonzero floor of one repeat each let a broken recovery pass with exit 0 before; now each is
refused (exit 3) or said to be insufficient (exit 8), and a correct resume says what it compared."""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness import launch, truestep_env
from truestep.analysis.runlog import RunLog
from truestep.analysis.summary import analyze_run

pytestmark = pytest.mark.multiprocess

MAX, STOP = 6, 3
COMMON = [f"--train.max_steps={MAX}", "--checkpoint.interval=2", "--checkpoint.keep_last_n=0"]
NOISE = "--train.emulate_nondeterminism=1e-3"
OPT_OFF = "--checkpoint.restore_optimizer_state=false"


def fidelity(run: Path, ref: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "truestep", "fidelity", str(run), "--reference", str(ref), *flags]
    return subprocess.run(cmd, env=truestep_env(), capture_output=True, text=True, timeout=240)


def resumed(half: Path, dest: Path, *switches: str) -> Path:
    shutil.copytree(half, dest)
    launch(dest, *COMMON, *switches)
    return dest


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("evidence")
    first = {
        "ref": lambda p: launch(p, *COMMON),
        "half": lambda p: launch(p, *COMMON, f"--train.stop_at_step={STOP}"),
        "wide": lambda p: launch(p, *COMMON, nproc=2),
        "noisy-ref": lambda p: launch(p, *COMMON, NOISE),
        "noisy-1": lambda p: launch(p, *COMMON, NOISE),
        "noisy-half": lambda p: launch(p, *COMMON, NOISE, f"--train.stop_at_step={STOP}"),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(job, base / name) for name, job in first.items()]:
            future.result()
        then = {
            "floor-1": lambda p: launch(p, *COMMON),
            "all-on": lambda p: resumed(base / "half", p),
            "opt-off": lambda p: resumed(base / "half", p, OPT_OFF),
            "noisy-opt-off": lambda p: resumed(base / "noisy-half", p, NOISE, OPT_OFF),
        }
        for future in [pool.submit(job, base / name) for name, job in then.items()]:
            future.result()
    return {name: base / name for name in [*first, *then]}


def test_a_correct_resume_says_what_it_compared(runs) -> None:
    result = analyze_run("all-on", RunLog.load(runs["all-on"]), RunLog.load(runs["ref"]), None)
    assert result.verdict.label == f"bitwise: {MAX}/{MAX} steps, 3/3 checkpoints, final parameters"
    assert result.comparison.run_only_checkpoints == [STOP]  # the planned stop's save: no counterpart
    assert fidelity(runs["all-on"], runs["ref"]).returncode == 0


def test_a_floor_mixing_layouts_is_refused_and_with_the_flag_cannot_pass_a_broken_resume(runs) -> None:
    """The audit: floor-1 (this layout) + a run of another layout made every threshold infinite, and the
    optimizer-off resume passed 'within floor', exit 0. Now the layout is checked (exit 3); with
    --cross-layout-floor the floor is labelled, floor-1 (bit-identical to the reference) is no draw of
    the noise, and one draw is an insufficient floor: exit 8, never 0."""
    floors = ["--floor", str(runs["floor-1"]), "--floor", str(runs["wide"])]
    proc = fidelity(runs["opt-off"], runs["ref"], *floors)
    assert proc.returncode == 3 and "ran in layout" in proc.stderr and "--cross-layout-floor" in proc.stderr
    proc = fidelity(runs["opt-off"], runs["ref"], *floors, "--cross-layout-floor")
    assert proc.returncode == 8, proc.stdout + proc.stderr
    assert "insufficient floor" in proc.stdout and "CROSS-LAYOUT" in proc.stdout


def test_the_reference_as_its_own_floor_is_refused(runs) -> None:
    """The audit: --reference R --floor R --floor F at an emulated floor made every threshold infinite."""
    floors = ["--floor", str(runs["noisy-ref"]), "--floor", str(runs["noisy-1"])]
    proc = fidelity(runs["noisy-opt-off"], runs["noisy-ref"], *floors)
    assert proc.returncode == 3 and "is the reference itself" in proc.stderr


def test_a_reference_stopped_early_is_refused(runs) -> None:
    """The audit: a reference stopped at step 11 of 30 made optimizer-off 'bitwise, 19 steps
    unverifiable', exit 0. A reference must have run to its end."""
    proc = fidelity(runs["opt-off"], runs["half"])
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"stopped at step {STOP} of {MAX} (stop_at_step)" in proc.stderr


def test_one_repeat_at_a_nonzero_floor_is_insufficient(runs) -> None:
    """The audit: K = 1 at an emulated floor flagged 27-43 % of failure-free runs (and could pass broken
    ones). With one distinct repeat nothing is judged: exit 8."""
    proc = fidelity(runs["noisy-opt-off"], runs["noisy-ref"], "--floor", str(runs["noisy-1"]))
    assert proc.returncode == 8, proc.stdout + proc.stderr
    assert "insufficient floor (INSUFFICIENT: 1 distinct repeat, 2 needed at a nonzero floor)" in proc.stdout
