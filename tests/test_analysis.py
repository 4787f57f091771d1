"""Every measure's formula on hand-made run directories with answers worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from truestep.analysis.fidelity import Floor, compare, first_violation, floor
from truestep.analysis.goodput import checkpoint_overhead, goodput
from truestep.analysis.mttr import incidents
from truestep.analysis.runlog import RunLog

TOKENS = 256


def line(step: int, attempt: int, end: float, loss: float | None = None, step_time: float = 1.0) -> dict:
    return {
        "step": step,
        "attempt": attempt,
        "time": end,
        "step_time": step_time,
        "loss": 10.0 - step * 0.5 if loss is None else loss,
        "grad_norm": 1.0 + step * 0.01,
        "lr": 1e-3,
        "tokens_seen": step * TOKENS,
    }


def write_run(path: Path, metrics: list[dict], events: list[dict]) -> RunLog:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return RunLog.load(path)


def reference(path: Path, steps: int = 10) -> RunLog:
    events = [{"time": 0.0, "event": "run_start", "attempt": 0, "process_start": 0.0}]
    return write_run(path, [line(s, 0, 1.0 + s) for s in range(1, steps + 1)], events)


def killed_and_resumed(path: Path, later_loss=None) -> RunLog:
    """Attempt 0 trains steps 1-6 (1 s each, step k ends at 1+k), saves at 5, is killed at 7.5; the
    supervisor detects at 8.0, tears down by 8.5, relaunches at 8.6; attempt 1 starts at 9.0, restores
    step 5 by 10.0 (0.5 s), recomputes 6-10 ending at 11.5..15.5."""
    later_loss = later_loss or (lambda s: None)
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 7)]
    metrics += [line(s, 1, 11.5 + s - 6, later_loss(s)) for s in range(6, 11)]
    sup = {"source": "supervisor"}
    events = [
        {"time": 0.0, "event": "supervisor_start", **sup},
        {"time": 0.0, "event": "attempt_start", **sup},
        {"time": 0.5, "event": "run_start", "attempt": 0, "process_start": 0.0},
        {
            "time": 6.1,
            "event": "checkpoint_save",
            "attempt": 0,
            "step": 5,
            "blocking_s": 0.25,
            "param_digest": "d5",
        },
        {
            "time": 7.5,
            "event": "fault_injected",
            "source": "fault",
            "kind": "kill",
            "step": 7,
            "rank": 1,
            "spec": "kill",
        },
        {"time": 8.0, "event": "failure_detected", "detected_at": 8.0, "kind": "process_exit", **sup},
        {"time": 8.5, "event": "teardown_complete", "teardown_s": 0.5, **sup},
        {"time": 8.6, "event": "attempt_start", **sup},
        {"time": 9.5, "event": "run_start", "attempt": 1, "process_start": 9.0},
        {
            "time": 10.0,
            "event": "checkpoint_restore",
            "attempt": 1,
            "step": 5,
            "restore_s": 0.5,
            "layout_changed": False,
        },
        {"time": 15.6, "event": "run_end", "attempt": 1, "param_digest": "final"},
    ]
    return write_run(path, metrics, events)


def test_identical_runs_are_bitwise(tmp_path: Path) -> None:
    fid = compare(reference(tmp_path / "a"), reference(tmp_path / "b"))
    assert fid.first_divergent_step is None and fid.fraction_bitwise_equal == 1.0
    assert fid.max_dloss == 0.0 and fid.missing_steps == []


def test_divergence_after_resume_is_located(tmp_path: Path) -> None:
    ref = reference(tmp_path / "ref")
    run = killed_and_resumed(tmp_path / "run", later_loss=lambda s: 10.0 - s * 0.5 + (1e-3 if s >= 7 else 0))
    fid = compare(run, ref)
    assert fid.first_divergent_step == 7
    assert fid.max_dloss == pytest.approx(1e-3)
    assert fid.fraction_bitwise_equal == pytest.approx(6 / 10)
    [window] = fid.windows
    assert window.resumed_at == 5 and window.steps == 5  # steps 6-10 were computed by attempt 1
    assert window.max_dloss == pytest.approx(1e-3) and window.mean_dloss == pytest.approx(4 * 1e-3 / 5)
    assert first_violation(run, ref, Floor(0.0, 0.0, True)) == 7


def test_floor_and_margin(tmp_path: Path) -> None:
    ref = reference(tmp_path / "ref")
    repeat = write_run(
        tmp_path / "rep", [line(s, 0, 1.0 + s, 10.0 - s * 0.5 + 1e-6) for s in range(1, 11)], []
    )
    base = floor(repeat, ref)
    assert base.max_dloss == pytest.approx(1e-6) and not base.bitwise
    within = write_run(
        tmp_path / "in", [line(s, 0, 1.0 + s, 10.0 - s * 0.5 + 1.5e-6) for s in range(1, 11)], []
    )
    beyond = write_run(
        tmp_path / "out",
        [line(s, 0, 1.0 + s, 10.0 - s * 0.5 + (3e-6 if s >= 4 else 0)) for s in range(1, 11)],
        [],
    )
    assert first_violation(within, ref, base, margin=2.0) is None
    assert first_violation(beyond, ref, base, margin=2.0) == 4


def test_missing_steps_and_nan_are_violations(tmp_path: Path) -> None:
    ref = reference(tmp_path / "ref")
    short = write_run(tmp_path / "short", [line(s, 0, 1.0 + s) for s in range(1, 9)], [])
    assert compare(short, ref).missing_steps == [9, 10]
    assert first_violation(short, ref, Floor(0, 0, True)) == 9
    nan = write_run(
        tmp_path / "nan", [line(s, 0, 1.0 + s, math.nan if s == 3 else None) for s in range(1, 11)], []
    )
    assert compare(nan, ref).max_dloss == math.inf
    assert first_violation(nan, ref, Floor(1.0, 1.0, False)) == 3


def test_goodput_and_badput_by_hand(tmp_path: Path) -> None:
    run = killed_and_resumed(tmp_path / "run")
    g = goodput(run, violation=None)
    assert g.wall_s == pytest.approx(15.6)
    assert g.steps == 10 and g.correct_steps == 10 and g.tokens_per_step == TOKENS
    assert g.plain_tokens_per_s == pytest.approx(10 * TOKENS / 15.6)
    assert g.useful_s == pytest.approx(10.0)
    expected = {
        "startup": 2.0,  # 1.0 before step 1; 10.5 - 9.0 - 0.5 restore in attempt 1
        "checkpoint_blocking": 0.25,
        "restore": 0.5,
        "lost_work": 1.0,  # step 6 of attempt 0, recomputed
        "detection": 0.5,
        "teardown": 0.5,
        "requeue_wait": 0.5,  # teardown done 8.5 -> attempt 1 process start 9.0
        "after_violation": 0.0,
        "other": 0.35,
    }
    assert g.badput_s == pytest.approx(expected)
    # Work after a violation does not count as correct.
    g7 = goodput(run, violation=7)
    assert g7.correct_steps == 6 and g7.badput_s["after_violation"] == pytest.approx(4.0)
    assert g7.correct_tokens_per_s == pytest.approx(6 * TOKENS / 15.6)
    overhead = checkpoint_overhead(run)
    assert overhead["saves"] == 1 and overhead["amortized_blocking_fraction"] == pytest.approx(0.25 / 10.25)


def test_mttr_phases_by_hand(tmp_path: Path) -> None:
    [inc] = incidents(killed_and_resumed(tmp_path / "run"))
    assert inc.kind == "kill" and inc.pre_fault_step == 6
    assert inc.phases_s == pytest.approx(
        {"detect": 0.5, "teardown": 0.5, "relaunch": 0.1, "restore": 1.4, "first_step": 1.5}
    )
    assert inc.mttr_s == pytest.approx(4.0) and inc.regain_s == pytest.approx(4.0)


def test_fault_before_the_first_checkpoint_restarts_from_scratch(tmp_path: Path) -> None:
    sup = {"source": "supervisor"}
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 4)] + [line(s, 1, 10.0 + s) for s in range(1, 11)]
    events = [
        {"time": 0.0, "event": "attempt_start", **sup},
        {"time": 0.5, "event": "run_start", "attempt": 0, "process_start": 0.0},
        {"time": 4.2, "event": "fault_injected", "kind": "kill", "spec": "kill"},
        {"time": 4.3, "event": "failure_detected", "detected_at": 4.3, **sup},
        {"time": 4.4, "event": "teardown_complete", "teardown_s": 0.1, **sup},
        {"time": 4.5, "event": "attempt_start", **sup},
        {"time": 9.5, "event": "run_start", "attempt": 1, "process_start": 9.0},
    ]
    run = write_run(tmp_path / "run", metrics, events)
    assert compare(run, reference(tmp_path / "ref")).windows == []
    [inc] = incidents(run)
    assert inc.phases_s["restore"] is None
    assert inc.phases_s["first_step"] == pytest.approx(11.0 - 4.5)
    assert inc.pre_fault_step == 3 and inc.regain_s == pytest.approx(13.0 - 4.2)
    assert goodput(run, None).badput_s["lost_work"] == pytest.approx(3.0)


def test_multiple_faults_and_a_layout_change(tmp_path: Path) -> None:
    sup = {"source": "supervisor"}
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 5)]
    metrics += [line(s, 1, 10.0 + s) for s in range(3, 7)] + [line(s, 2, 20.0 + s) for s in range(5, 11)]
    events = [
        {"time": 0.0, "event": "attempt_start", **sup},
        {"time": 0.1, "event": "run_start", "attempt": 0, "process_start": 0.0},
        {"time": 5.2, "event": "fault_injected", "kind": "kill", "spec": "a"},
        {"time": 5.3, "event": "failure_detected", "detected_at": 5.3, **sup},
        {"time": 5.4, "event": "teardown_complete", "teardown_s": 0.1, **sup},
        {"time": 5.5, "event": "attempt_start", **sup},
        {"time": 11.0, "event": "run_start", "attempt": 1, "process_start": 11.0},
        {
            "time": 12.0,
            "event": "checkpoint_restore",
            "attempt": 1,
            "step": 2,
            "restore_s": 0.2,
            "layout_changed": False,
        },
        {"time": 16.5, "event": "fault_injected", "kind": "hang", "spec": "b"},
        {"time": 19.5, "event": "failure_detected", "detected_at": 19.5, **sup},
        {"time": 19.6, "event": "teardown_complete", "teardown_s": 0.1, **sup},
        {"time": 19.7, "event": "attempt_start", **sup},
        {"time": 23.0, "event": "run_start", "attempt": 2, "process_start": 23.0},
        {
            "time": 24.0,
            "event": "checkpoint_restore",
            "attempt": 2,
            "step": 4,
            "restore_s": 0.2,
            "layout_changed": True,
        },
    ]
    run = write_run(tmp_path / "run", metrics, events)
    found = incidents(run)
    assert [i.kind for i in found] == ["kill", "hang"]
    assert found[1].phases_s["detect"] == pytest.approx(3.0)
    fid = compare(run, reference(tmp_path / "ref"))
    assert fid.layout_changed and [w.layout_changed for w in fid.windows] == [False, True]
    assert [w.steps for w in fid.windows] == [2, 6]  # attempt 1 keeps steps 3-4; attempt 2 redid 5-6
    assert goodput(run, None).badput_s["detection"] == pytest.approx(0.1 + 3.0)
