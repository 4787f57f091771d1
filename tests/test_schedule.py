"""Learning-rate schedule: warmup, cosine, constant, wsd, as a pure function of the step."""

from __future__ import annotations

import math

import pytest

from truestep.config import JobConfig, validate
from truestep.train.schedule import lr_at

PEAK = 1e-3


def _cfg(kind: str = "cosine", *, max_steps=100, warmup=10, ratio=0.1, decay=0) -> JobConfig:
    cfg = JobConfig()
    cfg.optim.lr = PEAK
    cfg.train.max_steps = max_steps
    cfg.schedule.kind = kind
    cfg.schedule.warmup_steps = warmup
    cfg.schedule.min_lr_ratio = ratio
    cfg.schedule.decay_steps = decay
    validate(cfg)
    return cfg


def _lrs(cfg: JobConfig) -> list[float]:
    return [lr_at(step, cfg) for step in range(cfg.train.max_steps)]


@pytest.mark.parametrize("kind", ["cosine", "constant", "wsd"])
def test_warmup_is_linear_from_lr_over_warmup_to_lr(kind):
    cfg = _cfg(kind, warmup=10)
    lrs = _lrs(cfg)
    assert lrs[0] == pytest.approx(PEAK / 10, rel=1e-12)
    assert lrs[9] == pytest.approx(PEAK, rel=1e-12)
    for step in range(10):
        assert lrs[step] == pytest.approx(PEAK * (step + 1) / 10, rel=1e-12)
    # Equal increments: linear.
    diffs = [b - a for a, b in zip(lrs[:9], lrs[1:10], strict=True)]
    assert max(diffs) - min(diffs) < 1e-15


def test_cosine_values_and_floor():
    cfg = _cfg("cosine", max_steps=100, warmup=10, ratio=0.1)
    floor = 0.1 * PEAK
    assert lr_at(10, cfg) == pytest.approx(PEAK, rel=1e-12)  # first step after warmup is the peak
    # The decay spans steps 10..99 (89 intervals): the last step that runs is exactly at the floor.
    expected_30 = floor + (PEAK - floor) * 0.5 * (1 + math.cos(math.pi * 20 / 89))
    assert lr_at(30, cfg) == pytest.approx(expected_30, rel=1e-12)
    assert lr_at(99, cfg) == pytest.approx(floor, rel=1e-12)
    assert lr_at(100, cfg) == pytest.approx(floor, rel=1e-12)
    assert lr_at(1000, cfg) == pytest.approx(floor, rel=1e-12)  # clamped, never rises again
    assert min(_lrs(cfg)) >= floor


def test_cosine_decreases_monotonically_after_warmup():
    cfg = _cfg("cosine", max_steps=200, warmup=20, ratio=0.0)
    lrs = _lrs(cfg)[20:]
    assert all(b < a for a, b in zip(lrs, lrs[1:], strict=False))
    assert lrs[-1] < 1e-3 * PEAK


def test_constant_stays_at_peak():
    cfg = _cfg("constant", max_steps=50, warmup=5, ratio=0.1)
    lrs = _lrs(cfg)
    assert lrs[4] == pytest.approx(PEAK)
    assert all(lr == PEAK for lr in lrs[5:])
    assert lr_at(10_000, cfg) == PEAK


def test_wsd_holds_then_decays_linearly_over_default_20_percent():
    cfg = _cfg("wsd", max_steps=100, warmup=10, ratio=0.1, decay=0)
    floor = 0.1 * PEAK
    lrs = _lrs(cfg)
    assert all(lr == PEAK for lr in lrs[10:80])  # stable phase up to max_steps - 20
    decay = lrs[80:]
    assert len(decay) == 20
    assert decay[0] == pytest.approx(PEAK + (floor - PEAK) / 20, rel=1e-12)
    assert decay[-1] == pytest.approx(floor, rel=1e-12)  # reaches the floor at the last step
    diffs = [b - a for a, b in zip(decay, decay[1:], strict=False)]
    assert all(d == pytest.approx((floor - PEAK) / 20, rel=1e-9) for d in diffs)


def test_wsd_explicit_decay_steps():
    cfg = _cfg("wsd", max_steps=60, warmup=0, ratio=0.0, decay=15)
    lrs = _lrs(cfg)
    assert all(lr == PEAK for lr in lrs[:45])
    assert lrs[45] < PEAK
    for i, lr in enumerate(lrs[45:]):
        assert lr == pytest.approx(PEAK * (1 - (i + 1) / 15), abs=1e-15)
    assert lrs[-1] == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("kind", ["cosine", "constant", "wsd"])
def test_zero_warmup(kind):
    cfg = _cfg(kind, max_steps=40, warmup=0, ratio=0.2)
    lrs = _lrs(cfg)
    assert lrs[0] == pytest.approx(PEAK, rel=1e-12)
    if kind == "cosine":
        assert lrs[-1] == pytest.approx(0.2 * PEAK, rel=1e-2)
        assert all(b < a for a, b in zip(lrs, lrs[1:], strict=False))
    elif kind == "wsd":
        assert lrs[-1] == pytest.approx(0.2 * PEAK, rel=1e-12)
        assert lrs[31] == PEAK and lrs[32] < PEAK  # default decay is 40 // 5 = 8 steps
    else:
        assert all(lr == PEAK for lr in lrs)


def test_lr_is_a_pure_function_of_the_step():
    cfg = _cfg("cosine", max_steps=100, warmup=10)
    forward = _lrs(cfg)
    backward = [lr_at(step, cfg) for step in reversed(range(100))][::-1]
    assert forward == backward


def test_wsd_warmup_overlapping_default_decay_is_rejected():
    from truestep.config import ConfigError

    with pytest.raises(ConfigError, match="warmup_steps"):
        _cfg("wsd", max_steps=100, warmup=90, decay=0)
