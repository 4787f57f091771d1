"""Each restore mechanism matters: with its switch off, the resume no longer reproduces the reference.

Dropout is on here so that the RNG streams shape the trajectory. Every case also runs the all-on resume
against the same reference, so a failure to diverge cannot come from a broken reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import events, launch, loss_bits_by_step

MAX, STOP = 8, 4
COMMON = [f"--train.max_steps={MAX}", "--checkpoint.interval=0", "--model.dropout=0.1"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    run = tmp_path_factory.mktemp("ablation-ref")
    launch(run, *COMMON)
    return loss_bits_by_step(run)


def resume_with(run: Path, *switches: str) -> dict[int, str]:
    launch(run, *COMMON, f"--train.stop_at_step={STOP}")
    launch(run, *COMMON, *switches)
    return loss_bits_by_step(run)


def test_all_mechanisms_on_reproduces_reference(reference, tmp_path: Path) -> None:
    assert resume_with(tmp_path) == reference


@pytest.mark.parametrize(
    "switch",
    [
        "--checkpoint.restore_optimizer_state=false",
        "--checkpoint.restore_rng_state=false",
        "--checkpoint.restore_data_position=false",
    ],
)
def test_disabled_restore_diverges_silently(switch: str, reference, tmp_path: Path) -> None:
    got = resume_with(tmp_path, switch)
    # Before the interruption the runs are identical; no crash, just a different trajectory after it.
    assert all(got[s] == reference[s] for s in range(1, STOP + 1))
    diverged = [s for s in range(STOP + 1, MAX + 1) if got[s] != reference[s]]
    assert diverged and diverged[0] == STOP + 1, f"switch {switch}: diverged at {diverged}"
    restore = events(tmp_path, "checkpoint_restore")[-1]
    assert restore["step"] == STOP
