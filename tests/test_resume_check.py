"""The resume self-check in real runs: a run hard-killed after its checkpoint at step 4 (SIGKILL as step 7
starts: steps 5 and 6 were logged and are lost) resumes and judges itself against its own pre-fault lines,
with no reference run. All mechanisms on: verified. Each restore mechanism switched off: diverged, at
the first replayed step its state shapes. Dropout is on so that the RNG streams shape the trajectory.

One killed run is made per module and copied for each resume (the copy is the same run directory); the
resumes run in the test process (harness.run_in_process: the same rank, without a fresh interpreter).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness import events, launch, metrics, run_in_process_captured

pytestmark = pytest.mark.multiprocess

COMMON = [
    "--train.max_steps=8",
    "--checkpoint.interval=4",
    "--checkpoint.async_save=false",
    "--model.dropout=0.1",
]


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("killed") / "run"
    proc = launch(run, *COMMON, "--fault=kill:rank=0:step=7", check=False)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4, 5, 6]
    return run


def resumed(killed: Path, tmp_path: Path, *switches: str, code: int = 0) -> tuple[Path, str]:
    run = tmp_path / "run"
    shutil.copytree(killed, run, symlinks=True)
    got, stderr = run_in_process_captured(run, *COMMON, "--metrics.tensorboard=true", *switches)
    assert got == code, stderr[-3000:]
    return run, stderr


def tb_self_check(run: Path) -> list[tuple[int, float]]:
    """(step, value) of the `resume/self_check` scalar, read back with TensorBoard's own reader."""
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = ea.EventAccumulator(str(run / "tb"), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("resume/self_check")]


def self_checks(run: Path) -> list[dict]:
    return [e for e in events(run) if e["event"].startswith("resume_")]


def test_all_mechanisms_on_the_resume_verifies_itself(killed: Path, tmp_path: Path) -> None:
    run, stderr = resumed(killed, tmp_path)
    (check,) = self_checks(run)
    assert check["event"] == "resume_verified"
    assert (check["restored_step"], check["last_prefault_step"]) == (4, 6)
    assert check["steps_compared"] == check["steps_bitwise_equal"] == 2
    assert "resume verified: steps 5..6 replayed bit for bit" in stderr
    assert tb_self_check(run) == [(6, 1.0)]
    assert events(run, "checkpoint_restore")[-1]["restored_digest"] == "matches"


@pytest.mark.parametrize(
    ("switch", "first_step"),
    [
        # The loss and grad norm of step s are computed before update s: fresh AdamW moments first change
        # the weights in update 5, so the first step that can show it is 6 (tests/test_ablation_switches.py).
        ("--checkpoint.restore_optimizer_state=false", 6),
        ("--checkpoint.restore_rng_state=false", 5),
        ("--checkpoint.restore_data_position=false", 5),
    ],
)
def test_each_mechanism_off_the_resume_flags_itself(
    switch: str, first_step: int, killed: Path, tmp_path: Path
) -> None:
    run, stderr = resumed(killed, tmp_path, switch)
    (check,) = self_checks(run)
    assert check["event"] == "resume_diverged", check
    assert check["first_step"] == first_step and "loss" in check["fields"]
    assert check["logged"]["loss"] != check["recomputed"]["loss"] and check["dloss"] > 0
    assert f"resume DIVERGED at step {first_step}" in stderr
    assert tb_self_check(run) == [(first_step, -1.0)]
    assert max(m["step"] for m in metrics(run)) == 8  # warn (the default): trains on


def test_stop_on_divergence_exits_before_training_on(killed: Path, tmp_path: Path) -> None:
    run, stderr = resumed(
        killed,
        tmp_path,
        "--checkpoint.restore_data_position=false",
        "--resilience.on_resume_divergence=stop",
        code=3,
    )
    assert [e["event"] for e in self_checks(run)] == ["resume_diverged"]
    assert [m["step"] for m in metrics(run) if m["attempt"] == 1] == []
    assert not [e for e in events(run, "checkpoint_save") if e["attempt"] == 1]
    assert "on_resume_divergence" in stderr


def test_switched_off_no_self_check(killed: Path, tmp_path: Path) -> None:
    run, _ = resumed(
        killed, tmp_path, "--checkpoint.restore_data_position=false", "--resilience.resume_check=false"
    )
    assert self_checks(run) == []


def test_a_restore_that_is_not_the_save_is_refused_by_its_digest(killed: Path, tmp_path: Path) -> None:
    # The emulated wrong restore perturbs every parameter after the load: not the bytes that were saved.
    run, stderr = resumed(killed, tmp_path, "--train.emulate_restore_error=1e-3", code=3)
    (mismatch,) = events(run, "restore_digest_mismatch")
    assert mismatch["step"] == 4 and mismatch["saved"] != mismatch["restored"]
    assert [e["reason"] for e in events(run, "checkpoint_quarantined")][0].startswith("failed to load")
    assert not (run / "checkpoints" / "step_00000004").exists()  # set aside; none older to fall back to
    assert not events(run, "checkpoint_restore")


def test_digest_check_off_the_replay_still_flags_the_wrong_restore(killed: Path, tmp_path: Path) -> None:
    run, _ = resumed(
        killed, tmp_path, "--train.emulate_restore_error=1e-3", "--checkpoint.verify_restored_digest=false"
    )
    assert events(run, "checkpoint_restore")[-1]["restored_digest"] == "off"
    (check,) = self_checks(run)
    assert check["event"] == "resume_diverged" and check["first_step"] == 5


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A graceful stop after step 4 (its save is at step 4: nothing will be replayed)."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    code, stderr = run_in_process_captured(run, *COMMON, "--train.stop_at_step=4")
    assert code == 0, stderr[-3000:]
    (witness,) = events(run, "stop_witness")
    assert witness["step"] == 4 and witness["witness_s"] > 0
    return run


def test_the_witness_leaves_an_fsdp_model_as_saved(tmp_path: Path) -> None:
    """FSDP2 keeps the root's parameters gathered after a forward without backward; the witness's
    forward must reshard them, or the end-of-run digest (and anything reading model.parameters()) sees
    full tensors, not the shards that were saved."""
    run = tmp_path / "run"
    launch(run, *COMMON, "--train.stop_at_step=4", nproc=2)
    (save,), (end,) = events(run, "checkpoint_save"), events(run, "run_end")
    assert events(run, "stop_witness") and end["param_digest"] == save["param_digest"]


@pytest.mark.parametrize(
    ("switch", "fields"),
    [
        ("", []),
        ("--checkpoint.restore_rng_state=false", ["rng_fingerprint", "loss"]),
        ("--checkpoint.restore_data_position=false", ["batch_fingerprint", "loss"]),
        # Fresh moments shape only the update: the first forward is the same, the fingerprint is not.
        ("--checkpoint.restore_optimizer_state=false", ["optimizer_fingerprint"]),
    ],
)
def test_graceful_stop_the_witness_judges_the_first_step(
    switch: str, fields: list[str], stopped: Path, tmp_path: Path
) -> None:
    run, stderr = resumed(stopped, tmp_path, *([switch] if switch else []))
    (check,) = self_checks(run)  # no "nothing to replay" beside it: the witness judges this resume
    assert check["witness"] and check["first_step"] == 5 and check["fields"] == fields
    assert check["event"] == ("resume_diverged" if fields else "resume_verified")
    if not fields:  # the forward pass of the witness is the first step's loss, bit for bit
        assert check["logged"]["loss"] == check["recomputed"]["loss"] and check["dloss"] == 0
        assert "resume verified against the stop witness" in stderr


@pytest.fixture(scope="module")
def unstaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An async save of step 4 that takes no staged copy; a `mutate` fault changes the parameters and
    optimizer state it is writing; SIGKILL as the save of step 8 begins, i.e. after it has waited for
    step 4's write and commit (a kill at a fixed step raced the background commit on a loaded machine).
    The bytes on disk are not the saved state."""
    run = tmp_path_factory.mktemp("unstaged") / "run"
    proc = launch(
        run,
        *UNSTAGED,
        "--checkpoint.emulate_unstaged_async_save=true",
        "--fault=mutate:step=4;crash:at=save:before-shards:step=8",
        check=False,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]
    return run


UNSTAGED = [*COMMON[:2], "--checkpoint.async_save=true", *COMMON[3:]]


def test_a_save_mutated_while_writing_unstaged_is_refused_by_its_digest(
    unstaged: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(unstaged, run, symlinks=True)
    code, stderr = run_in_process_captured(run, *UNSTAGED)
    assert code == 3, stderr[-3000:]
    (mismatch,) = events(run, "restore_digest_mismatch")
    assert mismatch["step"] == 4 and mismatch["saved"] != mismatch["restored"]
    assert not events(run, "checkpoint_restore")


def test_a_staged_async_save_survives_the_mutation(tmp_path: Path) -> None:
    # Staging on (the default): the write reads the staged copy, so the restore is what was saved; the
    # mutation changed the live trajectory after the save, and the replayed steps 5..8 say so. The kill
    # comes as the save of step 8 begins, after step 4's save was written and committed.
    run = tmp_path / "run"
    proc = launch(run, *UNSTAGED, "--fault=mutate:step=4;crash:at=save:before-shards:step=8", check=False)
    assert proc.returncode == -9, proc.stderr[-3000:]
    code, stderr = run_in_process_captured(run, *UNSTAGED)
    assert code == 0, stderr[-3000:]
    assert events(run, "checkpoint_restore")[-1]["restored_digest"] == "matches"
    (check,) = self_checks(run)
    assert check["event"] == "resume_diverged" and check["first_step"] == 5
