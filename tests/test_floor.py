"""The floor envelope and its leave-one-out calibration, worked out by hand (docs/measures.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis_cases import clean, loss_of
from truestep.analysis.fidelity import compare
from truestep.analysis.floor import f32_ulp, measure_floor, ratio
from truestep.analysis.verdict import Status, judge

F1 = [0, 1, 0, 0, 5, 0]
F2 = [0, 0, 2, 0, 0, 0]
UNIT = 1e-3


def offset(values: list[float]):
    return lambda s: loss_of(s) + UNIT * values[s - 1]


@pytest.fixture
def floor(tmp_path: Path):
    ref = clean(tmp_path / "ref", steps=6)
    repeats = [
        clean(tmp_path / f"f{i}", steps=6, loss=offset(v), digest=f"d{i}") for i, v in enumerate((F1, F2))
    ]
    return ref, measure_floor(ref, repeats, margin=2.0)


def test_envelope_is_a_running_max_that_looks_two_steps_ahead(floor) -> None:
    _, model = floor
    loss = model.families["loss"]
    # E(s) = max over both repeats of their values at steps <= s + 2.
    assert loss.envelope.steps == [1, 2, 3, 4, 5, 6]
    assert loss.envelope.values == pytest.approx([2e-3, 2e-3, 5e-3, 5e-3, 5e-3, 5e-3])


def test_leave_one_out_calibrates_the_threshold(floor) -> None:
    _, model = floor
    loss = model.families["loss"]
    # Repeat 1 against repeat 2's envelope (2e-3 throughout): its 5e-3 at step 5 is 2.5x.
    # Repeat 2 against repeat 1's envelope (1e-3, 1e-3, 5e-3, ...): its 2e-3 at step 3 is 0.4x.
    assert loss.loo == pytest.approx([2.5, 0.4])
    assert loss.calibrated and loss.tau == pytest.approx(2.0 * 2.5)


def test_a_run_is_judged_against_tau_times_the_envelope_at_its_step(floor, tmp_path: Path) -> None:
    ref, model = floor
    inside = clean(tmp_path / "in", steps=6, loss=offset([0, 0, 24, 0, 0, 0]), digest="x")
    late = clean(tmp_path / "late", steps=6, loss=offset([0, 0, 0, 0, 0, 0.1]), digest="y")
    early = clean(tmp_path / "early", steps=6, loss=offset([11, 0, 0, 0, 0, 0]), digest="z")
    # Hand-made runs keep no checkpoints: at a nonzero floor their final parameters cannot be judged
    # (a digest says nothing there), so a run within the floor on every step is INCOMPLETE, never a pass.
    v = judge(compare(inside, ref), model)  # 24e-3 <= 5 x 5e-3
    assert v.violation is None and v.status is Status.INCOMPLETE
    assert [g.what for g in v.gaps] == ["final parameters not compared at step"] and v.exit_code == 8
    v = judge(compare(early, ref), model)  # 11e-3 > 5 x 2e-3 at step 1
    assert v.first_violation_step == 1 and v.violation.threshold == pytest.approx(1e-2)
    v = judge(compare(late, ref), model)  # 0.1e-3 at step 6
    assert v.violation is None and v.first_divergent_step == 6


def test_one_repeat_is_uncalibrated_and_ratios_handle_zero_and_infinity(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref", steps=6)
    model = measure_floor(ref, [clean(tmp_path / "f", steps=6, loss=offset(F1), digest="d")], margin=3.0)
    assert not model.families["loss"].calibrated and model.families["loss"].tau == 3.0
    assert (
        ratio(0.0, 0.0) == 0.0
        and ratio(1e-9, 0.0) == float("inf")
        and ratio(float("inf"), float("inf")) == 0.0
    )
    assert f32_ulp(1.0) == 2.0**-23 and f32_ulp(7.5) == 2.0**-21
