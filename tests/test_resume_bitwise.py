"""Bitwise determinism and bitwise resume across layouts, with real torchrun/gloo process groups.

Per layout: a reference run of MAX steps; a second fresh run must equal it bit for bit; an async-save
run interrupted twice (resume twice in a row) and a sync-save run interrupted once must reproduce every
per-step loss bit pattern and the final parameter digest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import LAYOUT_REFERENCE as COMMON
from harness import LAYOUT_STEPS as MAX
from harness import LAYOUTS, events, final_digest, launch, loss_bits_by_step, metrics

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def reference(layout_references: dict[str, Path]) -> dict[str, Path]:
    """One failure-free run per layout (conftest.py; tests/test_standby.py compares with them too)."""
    return layout_references


def assert_same_trajectory(run: Path, ref: Path) -> None:
    got, want = loss_bits_by_step(run), loss_bits_by_step(ref)
    assert sorted(got) == list(range(1, MAX + 1)), f"steps logged: {sorted(got)}"
    diverged = [s for s in want if got[s] != want[s]]
    assert not diverged, f"loss bits differ at steps {diverged}"
    assert final_digest(run) == final_digest(ref), "final parameters differ"


@pytest.mark.parametrize("layout", ["single", "fsdp2xtp2"])
def test_two_fresh_runs_are_bitwise_identical(layout: str, reference, tmp_path: Path) -> None:
    nproc, extra = LAYOUTS[layout]
    launch(tmp_path, *COMMON, *extra, nproc=nproc)
    assert_same_trajectory(tmp_path, reference[layout])


def test_layouts_agree_to_fp32_tolerance(reference) -> None:
    base = metrics(reference["single"])
    for name in ("fsdp2", "tp2", "fsdp2xtp2"):
        other = metrics(reference[name])
        for a, b in zip(base, other, strict=True):
            assert a["step"] == b["step"]
            assert abs(a["loss"] - b["loss"]) < 2e-5, (name, a["step"], a["loss"], b["loss"])
            assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * max(1.0, a["grad_norm"]), (name, a, b)
    # Sanity: the model does learn, so agreement is not two constant curves.
    assert base[-1]["loss"] < base[0]["loss"] - 0.3


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_async_resume_twice_is_bitwise(layout: str, reference, tmp_path: Path) -> None:
    nproc, extra = LAYOUTS[layout]
    launch(tmp_path, *COMMON, *extra, "--train.stop_at_step=3", nproc=nproc)
    launch(tmp_path, *COMMON, *extra, "--train.stop_at_step=5", nproc=nproc)
    launch(tmp_path, *COMMON, *extra, nproc=nproc)
    assert_same_trajectory(tmp_path, reference[layout])
    restores = events(tmp_path, "checkpoint_restore")
    assert [r["step"] for r in restores] == [3, 5]
    assert all(r["rng_policy"] == "restored" and not r["layout_changed"] for r in restores)
    assert events(tmp_path, "run_end")[-1]["state"]["attempts"] == 3


# Sync and async saves differ only in when the loop waits for the writes (the state dict and DCP plan are
# the same): every layout is resumed from async saves above; sync saves in the 1-D extreme and the 2-D
# mesh (both FSDP and TP dimensions) keep the suite within its time budget.
@pytest.mark.parametrize("layout", ["single", "fsdp2xtp2"])
def test_sync_resume_is_bitwise(layout: str, reference, tmp_path: Path) -> None:
    nproc, extra = LAYOUTS[layout]
    sync = "--checkpoint.async_save=false"
    launch(tmp_path, *COMMON, *extra, sync, "--train.stop_at_step=4", nproc=nproc)
    launch(tmp_path, *COMMON, *extra, sync, nproc=nproc)
    assert_same_trajectory(tmp_path, reference[layout])
    saves = events(tmp_path, "checkpoint_save")
    assert saves and all(s["async_save"] is False for s in saves)
