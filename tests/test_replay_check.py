"""The resume self-check's comparison (train/selfcheck/replay.py), in process: which pre-fault lines make the
window, and how a replayed step is judged on a bitwise and on a noisy platform."""

from __future__ import annotations

import math
import struct

import pytest

from truestep.config.errors import ConfigError
from truestep.config.load import load_config
from truestep.train.selfcheck.replay import ReplayCheck, Verdict, prefault_window


def line(step: int, attempt: int, loss: float = 2.0, **extra: float) -> dict:
    return {"step": step, "attempt": attempt, "loss": loss, "grad_norm": 1.5, "lr": 1e-3,
            "tokens_seen": 256 * step, "time": 123.0 + step, "step_time": 0.1, **extra}  # fmt: skip


def next_float(x: float) -> float:
    """The float64 one ulp above x."""
    return struct.unpack(">d", struct.pack(">q", struct.unpack(">q", struct.pack(">d", x))[0] + 1))[0]


def test_window_takes_the_latest_earlier_attempt_and_stops_at_a_gap() -> None:
    lines = [line(s, 0, loss=1.0) for s in range(1, 9)]
    lines += [line(5, 1, loss=5.5), line(6, 1, loss=6.5)]  # attempt 1 replayed 5..6, then died
    lines += [line(5, 2, loss=9.9)]  # the current attempt's own line is never a pre-fault line
    window = prefault_window(lines, restored_step=4, attempt=2)
    assert sorted(window) == [5, 6, 7, 8]
    assert window[5]["loss"] == 5.5 and window[6]["loss"] == 6.5 and window[7]["attempt"] == 0
    gap = [line(s, 0) for s in (5, 6, 8)]
    assert sorted(prefault_window(gap, restored_step=4, attempt=1)) == [5, 6]


def test_window_ends_before_a_step_the_nan_guard_skipped() -> None:
    lines = [line(5, 0), line(6, 0, loss=math.nan), line(7, 0)]
    assert sorted(prefault_window(lines, restored_step=4, attempt=1)) == [5]
    assert prefault_window([{"step": "5", "attempt": 0}], restored_step=4, attempt=1) == {}


def test_bitwise_platform_verifies_equal_bits_and_flags_one_ulp() -> None:
    window = {5: line(5, 0), 6: line(6, 0)}
    check = ReplayCheck(4, window, bitwise=True)
    assert check.compare(5, line(5, 1)) is None  # bookkeeping (time, attempt) is not compared
    assert check.compare(6, line(6, 1)) is None
    assert check.verdict() == (Verdict.VERIFIED, "")
    assert check.facts()["steps_bitwise_equal"] == 2

    check = ReplayCheck(4, window, bitwise=True)
    assert check.compare(5, line(5, 1)) is None
    mismatch = check.compare(6, line(6, 1, loss=next_float(2.0)))
    assert mismatch is not None and mismatch.step == 6 and mismatch.fields == ("loss",)
    assert "first update" in mismatch.points_at
    assert check.verdict()[0] == Verdict.DIVERGED and not check.pending(6)
    facts = check.facts()
    assert facts["first_step"] == 6 and facts["dloss"] == next_float(2.0) - 2.0
    assert "DIVERGED at step 6" in check.summary()


def test_first_replayed_step_and_counters_point_at_their_cause() -> None:
    window = {5: line(5, 0)}
    check = ReplayCheck(4, window, bitwise=True)
    assert "weights, data position or RNG" in check.compare(5, line(5, 1, loss=2.5)).points_at
    check = ReplayCheck(4, window, bitwise=True)
    assert "token counters" in check.compare(5, line(5, 1, tokens_seen=0)).points_at


def test_noisy_platform_without_floor_reports_without_a_verdict() -> None:
    check = ReplayCheck(4, {5: line(5, 0)}, bitwise=False)
    assert check.compare(5, line(5, 1, loss=2.001)) is None
    verdict, reason = check.verdict()
    assert verdict == Verdict.UNVERIFIED and "no resilience.resume_check_floor" in reason
    assert check.facts()["max_dloss"] == pytest.approx(0.001) and check.facts()["deviations"] == ["5:loss"]


def test_noisy_platform_with_floor_judges_the_loss_and_still_demands_exact_counters() -> None:
    within = ReplayCheck(4, {5: line(5, 0)}, bitwise=False, floor=0.01)
    assert within.compare(5, line(5, 1, loss=2.001)) is None
    assert within.verdict() == (Verdict.VERIFIED, "")
    beyond = ReplayCheck(4, {5: line(5, 0)}, bitwise=False, floor=0.01)
    assert beyond.compare(5, line(5, 1, loss=2.5)).fields == ("loss",)
    lr = ReplayCheck(4, {5: line(5, 0)}, bitwise=False, floor=0.01)
    assert lr.compare(5, line(5, 1, lr=2e-3)).fields == ("lr",)


def test_nothing_to_replay_is_unverified() -> None:
    check = ReplayCheck(8, {}, bitwise=True)
    assert check.verdict() == (Verdict.UNVERIFIED, "no pre-fault step to replay")
    assert check.last_step == 8


@pytest.mark.parametrize(
    "bad", ["--resilience.on_resume_divergence=abort", "--resilience.resume_check_floor=-1"]
)
def test_config_refuses_bad_switches(bad: str) -> None:
    with pytest.raises(ConfigError):
        load_config("tiny", [bad])


def test_report_label_sums_up_the_runs_self_checks(tmp_path) -> None:
    from truestep.analysis.runlog import RunLog
    from truestep.analysis.self_check import self_check_label

    def run(*events: dict) -> RunLog:
        return RunLog(tmp_path, [], [{"time": 1.0, **e} for e in events])

    assert self_check_label(run()) == "-"
    verified = {"event": "resume_verified"}
    assert self_check_label(run(verified, verified)) == "verified 2"
    diverged = {"event": "resume_diverged", "first_step": 6}
    label = self_check_label(run(verified, diverged, {"event": "resume_unverified"}))
    assert label == "DIVERGED at 6; verified 1; unverified 1"
