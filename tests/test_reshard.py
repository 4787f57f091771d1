"""Resharded resume: save at one layout, resume at another; DCP reshards weights and optimizer state,
the data order is kept, RNG streams are re-derived and the event log says so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from harness import LAYOUT_REFERENCE, LAYOUTS, events, launch, metrics

pytestmark = pytest.mark.multiprocess

MAX, STOP = 8, 4
COMMON = [f"--train.max_steps={MAX}", "--checkpoint.interval=0", "--schedule.warmup_steps=2"]


@pytest.fixture(scope="module")
def reference(layout_reference: Callable[[str], Path]) -> list[dict]:
    """The single-process run of this job: the same as the single layout's reference (conftest.py), so
    a session that runs both computes it once."""
    assert COMMON == LAYOUT_REFERENCE  # the shared run is this job's only while the two agree
    return metrics(layout_reference("single"))


@pytest.mark.parametrize(
    ("saved", "resumed"),
    [("fsdp2xtp2", "fsdp2"), ("fsdp2xtp2", "tp2"), ("fsdp2xtp2", "single"), ("fsdp2", "fsdp2xtp2")],
)
def test_resharded_resume_keeps_the_trajectory(saved: str, resumed: str, reference, tmp_path: Path) -> None:
    nproc, extra = LAYOUTS[saved]
    launch(tmp_path, *COMMON, *extra, f"--train.stop_at_step={STOP}", nproc=nproc)
    nproc, extra = LAYOUTS[resumed]
    launch(tmp_path, *COMMON, *extra, nproc=nproc)

    got = metrics(tmp_path)
    assert [m["step"] for m in got] == list(range(1, MAX + 1))
    for a, b in zip(reference, got, strict=True):
        # Within fp32 tolerance of the single-process reference: a wrong data position, lost optimizer
        # state or mis-resharded weights move the loss by orders of magnitude more than this.
        assert abs(a["loss"] - b["loss"]) < 2e-5, (saved, resumed, a["step"], a["loss"], b["loss"])
    restore = events(tmp_path, "checkpoint_restore")[-1]
    assert restore["step"] == STOP and restore["layout_changed"] is True
    assert restore["rng_policy"] == "rederived"
    assert restore["saved_layout"]["world_size"] == LAYOUTS[saved][0]
