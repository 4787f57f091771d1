"""The parts of benchmarks/ that decide what a number means: the counterbalanced order and the MTTR
phases. Checked on constructed inputs (the benchmarks themselves are run by hand, not in the suite)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_common import abba, spread  # noqa: E402
from recovery_phases import PHASES, phases  # noqa: E402


@pytest.mark.parametrize("sides", [("on", "off"), ("A", "B", "C"), ("a", "b", "c", "d")])
def test_abba_puts_every_side_equally_often_at_every_position(sides: tuple[str, ...]) -> None:
    rounds = 2 * len(sides)
    order = abba(sides, rounds)
    assert len(order) == rounds * len(sides)
    blocks = [order[i : i + len(sides)] for i in range(0, len(order), len(sides))]
    assert all(sorted(block) == sorted(sides) for block in blocks)
    for position in range(len(sides)):
        seen = Counter(block[position] for block in blocks)
        assert set(seen.values()) == {rounds // len(sides)}, (position, seen)
    if len(sides) == 2:
        assert order[:8] == ["on", "off", "off", "on", "off", "on", "on", "off"]


def test_spread_reports_the_range_with_the_median() -> None:
    assert spread([3.0, 1.0, 2.0]) == "2.000 [1.000-3.000]"
    assert spread([]) == "-"


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_recovery_phases_add_up_to_the_mttr(tmp_path: Path) -> None:
    t0 = 1000.0
    sup = {"source": "supervisor"}
    _write(
        tmp_path / "events.jsonl",
        [
            {**sup, "time": t0 - 5, "event": "attempt_start", "attempt": 0, "pids": [1, 2]},
            {**sup, "time": t0 + 0.11, "event": "failure_detected", "detected_at": t0 + 0.1},
            {**sup, "time": t0 + 0.15, "event": "teardown_complete", "teardown_s": 0.04},
            {**sup, "time": t0 + 0.151, "event": "standby_handoff", "ready": True},
            {**sup, "time": t0 + 0.152, "event": "standby_handoff", "ready": False},
            {**sup, "time": t0 + 0.153, "event": "attempt_start", "attempt": 1, "pids": [3, 4]},
            {
                "time": t0 + 0.22,
                "attempt": 1,
                "event": "rendezvous",
                "began": t0 + 0.16,
                "rendezvous_s": 0.05,
            },
            {"time": t0 + 0.25, "attempt": 1, "event": "checkpoint_verified", "verify_s": 0.01},
            {"time": t0 + 0.5, "attempt": 1, "event": "checkpoint_restore", "restore_s": 0.2, "step": 5},
        ],
    )
    before = [{"attempt": 0, "step": s, "time": t0 - 1 + s / 10, "step_time": 0.03} for s in range(1, 8)]
    after = [
        {"attempt": 1, "step": s, "time": t0 + 0.55 + (s - 6) / 10, "step_time": 0.03} for s in range(6, 9)
    ]
    _write(tmp_path / "metrics.jsonl", before + after)
    got = phases("sigkill", tmp_path, t0)
    assert sum(got[p] for p in PHASES) == pytest.approx(got["mttr"])
    expected = {"detect": 0.1, "teardown": 0.05, "handoff": 0.01, "rendezvous": 0.05, "restore": 0.29}
    assert {p: round(got[p], 6) for p in expected} == expected
    assert got["first_step"] == pytest.approx(0.05) and got["build"] == pytest.approx(0.03)
    assert got["mttr"] == pytest.approx(0.55)
    assert got["limit"] == pytest.approx(0.1 + 0.01 + 0.2 + 0.03)
    assert got["gap"] == pytest.approx(0.55 - 0.34)
    assert got["standbys"] == "1/2 ready standbys"
    assert got["redone"] == 2 and got["attempt"] == 1
    assert got["regained"] == pytest.approx(0.65)  # step 7 again


def test_clopper_pearson_matches_the_known_exact_intervals() -> None:
    """detection_power.py calls a target met only from these bounds: 0/100 -> upper 3.62 % (the
    "rule of three" is the one-sided 3.0 %), 5/100 -> [1.64 %, 11.28 %]."""
    from bench_common import clopper_pearson

    assert clopper_pearson(0, 100) == pytest.approx((0.0, 0.03622), abs=1e-5)
    assert clopper_pearson(5, 100) == pytest.approx((0.01643, 0.11283), abs=1e-5)
    assert clopper_pearson(20, 20) == pytest.approx((0.83157, 1.0), abs=1e-5)
    assert clopper_pearson(0, 0) == (0.0, 1.0)


def test_cold_restart_reads_the_attempts_own_phases(tmp_path: Path) -> None:
    from cold_restart import phases_of_last_attempt

    sup = {"source": "supervisor"}
    phases = {"import": 2.0, "build": 0.3, "init": 0.0, "verify": 0.01, "load": 1.2}
    _write(
        tmp_path / "events.jsonl",
        [
            {**sup, "time": 10.0, "event": "attempt_start", "attempt": 0},
            {"time": 14.0, "event": "run_start", "attempt": 0, "process_start": 10.5, "startup_phases": {}},
            {**sup, "time": 50.0, "event": "attempt_start", "attempt": 1},
            {"time": 52.6, "event": "rendezvous", "attempt": 1, "began": 52.5, "rendezvous_s": 0.1},
            {
                "time": 55.0,
                "event": "run_start",
                "attempt": 1,
                "process_start": 50.4,
                "startup_phases": phases,
            },
        ],
    )
    _write(
        tmp_path / "metrics.jsonl",
        [{"step": 1, "attempt": 0, "time": 15.0}, {"step": 2, "attempt": 1, "time": 56.5}],
    )
    got = phases_of_last_attempt(tmp_path)
    assert got == pytest.approx(
        {"process": 0.4, "rendezvous": 0.1, **phases, "first step": 1.5, "total": 6.5}
    )
