"""Each restore mechanism matters: with its switch off, the resume no longer reproduces the reference.

Dropout is on here so that the RNG streams shape the trajectory. Every case also runs the all-on resume
against the same reference, so a failure to diverge cannot come from a broken reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import events, launch, loss_bits_by_step

pytestmark = pytest.mark.multiprocess

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
    ("switch", "first_divergent"),
    [
        # The loss of step s is computed before update s: fresh AdamW moments first change the weights
        # in update STOP+1, so the first different loss is STOP+2. Dropout masks and batches change the
        # very first resumed forward pass.
        ("--checkpoint.restore_optimizer_state=false", STOP + 2),
        ("--checkpoint.restore_rng_state=false", STOP + 1),
        ("--checkpoint.restore_data_position=false", STOP + 1),
    ],
)
def test_disabled_restore_diverges_silently(
    switch: str, first_divergent: int, reference, tmp_path: Path
) -> None:
    got = resume_with(tmp_path, switch)
    # Before the interruption the runs are identical; no crash, just a different trajectory after it.
    assert all(got[s] == reference[s] for s in range(1, STOP + 1))
    diverged = [s for s in range(STOP + 1, MAX + 1) if got[s] != reference[s]]
    assert diverged and diverged[0] == first_divergent, f"switch {switch}: diverged at {diverged}"
    restore = events(tmp_path, "checkpoint_restore")[-1]
    assert restore["step"] == STOP
