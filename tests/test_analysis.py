"""Every measure's formula on hand-made run directories with answers worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from analysis_cases import (
    TOKENS,
    clean,
    killed_and_resumed,
    line,
    loss_of,
    restarted_from_scratch,
    start,
    write_run,
)
from truestep.analysis.fidelity import compare
from truestep.analysis.floor import measure_floor
from truestep.analysis.goodput import checkpoint_overhead, goodput
from truestep.analysis.mttr import incidents
from truestep.analysis.runlog import RunLog
from truestep.analysis.verdict import Status, judge

EXACT = None


def verdict(run, ref, repeats=()):
    return judge(compare(run, ref), measure_floor(ref, list(repeats)))


def test_identical_runs_are_bitwise(tmp_path: Path) -> None:
    fid = compare(clean(tmp_path / "a"), clean(tmp_path / "b"))
    assert fid.first_divergent_step is None and fid.fraction_bitwise_equal == 1.0
    assert fid.max_dloss == 0.0 and fid.missing_steps == [] and fid.digests == {10: True}
    assert verdict(clean(tmp_path / "c"), clean(tmp_path / "d")).status is Status.BITWISE


def test_divergence_after_resume_is_located(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    run = killed_and_resumed(tmp_path / "run", later_loss=lambda s: loss_of(s) + (1e-3 if s >= 7 else 0))
    fid = compare(run, ref)
    assert fid.first_divergent_step == 7
    assert fid.max_dloss == pytest.approx(1e-3)
    assert fid.fraction_bitwise_equal == pytest.approx(6 / 10)
    [window] = fid.windows
    assert window.resumed_at == 5 and window.steps == 5  # steps 6-10 were computed by attempt 1
    assert window.max_dloss == pytest.approx(1e-3) and window.mean_dloss == pytest.approx(4 * 1e-3 / 5)
    v = judge(fid, measure_floor(ref, []))
    assert v.status is Status.VIOLATED and v.first_violation_step == 7 and v.violation.observable == "loss"


def test_nonzero_floor_and_margin(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    repeat = clean(tmp_path / "rep", loss=lambda s: loss_of(s) + 1e-6, digest="other")
    floor = measure_floor(ref, [repeat], margin=2.0)
    assert floor.max_dloss == pytest.approx(1e-6) and not floor.bitwise
    within = clean(tmp_path / "in", loss=lambda s: loss_of(s) + 1.5e-6, digest="x")
    beyond = clean(tmp_path / "out", loss=lambda s: loss_of(s) + (3e-6 if s >= 4 else 0), digest="y")
    v = judge(compare(within, ref), floor)
    assert v.violation is None and v.status is Status.INSUFFICIENT_FLOOR  # K = 1 at a nonzero floor
    floor = measure_floor(
        ref, [repeat, clean(tmp_path / "rep2", loss=lambda s: loss_of(s) - 1e-6, digest="o2")]
    )
    v = judge(compare(within, ref), floor)
    assert v.violation is None and v.status is Status.INCOMPLETE  # no state: final parameters not judged
    v = judge(compare(beyond, ref), floor)
    assert v.first_violation_step == 4 and v.violation.threshold == pytest.approx(2e-6)


def test_missing_steps_and_nan_are_violations(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    short = write_run(tmp_path / "short", [line(s, 0, 1.0 + s) for s in range(1, 9)], [start(0, 0.5)])
    assert compare(short, ref).missing_steps == [9, 10]
    v = verdict(short, ref)
    assert v.status is Status.INCOMPLETE and v.first_violation_step is None and v.first_divergent_step == 9
    assert v.label == "INCOMPLETE: the run never logged steps 9-10 (2 steps)" and v.exit_code == 8
    nan = clean(tmp_path / "nan", loss=lambda s: math.nan if s == 3 else loss_of(s))
    assert compare(nan, ref).max_dloss == math.inf
    repeats = [
        clean(tmp_path / f"rep{k}", loss=lambda s, k=k: loss_of(s) + 0.5 * k, digest=f"o{k}") for k in (1, 2)
    ]
    assert judge(compare(nan, ref), measure_floor(ref, repeats)).first_violation_step == 3


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
        "unverifiable": 0.0,
        "detection": 0.5,
        "teardown": 0.5,
        "requeue_wait": 0.5,  # teardown done 8.5 -> attempt 1 process start 9.0
        "after_violation": 0.0,
        "not_running": 0.0,
        "refused": 0.0,
        "other": 0.35,
    }
    assert g.badput_s == pytest.approx(expected) and g.inconsistencies == []
    # The buckets are sums of the spans the timeline draws.
    for kind, total in expected.items():
        if kind != "other":
            assert sum(s.duration for s in g.spans if s.kind == kind) == pytest.approx(total), kind
    # Work after a violation does not count as correct.
    g7 = goodput(run, violation=7)
    assert g7.correct_steps == 6 and g7.badput_s["after_violation"] == pytest.approx(4.0)
    assert g7.correct_tokens_per_s == pytest.approx(6 * TOKENS / 15.6)
    overhead = checkpoint_overhead(run)
    assert overhead.saves == 1 and overhead.amortized_blocking_fraction == pytest.approx(0.25 / 10.25)


def test_mttr_phases_by_hand(tmp_path: Path) -> None:
    [inc] = incidents(killed_and_resumed(tmp_path / "run"))
    assert inc.kind == "kill" and inc.pre_fault_step == 6 and inc.attempt == 0
    assert inc.phases_s == pytest.approx(
        {"detect": 0.5, "teardown": 0.5, "relaunch": 0.1, "restore": 1.4, "first_step": 1.5}
    )
    assert inc.mttr_s == pytest.approx(4.0) and inc.regain_s == pytest.approx(4.0)


def test_an_incident_carries_the_recovering_attempts_own_startup_phases(tmp_path: Path) -> None:
    path = tmp_path / "run"
    killed_and_resumed(path)
    phases = {"import": 1.5, "build": 0.2, "init": 0.0, "verify": 0.01, "load": 0.4}
    records = [json.loads(x) for x in (path / "events.jsonl").read_text().splitlines()]
    for r in records:
        if r["event"] == "run_start" and r["attempt"] == 1:
            r["startup_phases"] = phases
    (path / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    [inc] = incidents(RunLog.load(path))
    assert inc.startup_s == phases
    assert incidents(killed_and_resumed(tmp_path / "older"))[0].startup_s is None  # runs before the field


def test_fault_before_the_first_checkpoint_restarts_from_scratch(tmp_path: Path) -> None:
    run = restarted_from_scratch(tmp_path / "run", 10)
    assert compare(run, clean(tmp_path / "ref")).windows == []
    [inc] = incidents(run)
    assert inc.phases_s["restore"] is None
    assert inc.phases_s["first_step"] == pytest.approx(11.0 - 4.5)
    assert inc.pre_fault_step == 3 and inc.regain_s == pytest.approx(13.0 - 4.2)
    assert goodput(run, None).badput_s["lost_work"] == pytest.approx(3.0)


def test_multiple_faults_and_a_layout_change(tmp_path: Path) -> None:
    sup = {"source": "supervisor"}
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 5)]
    metrics += [line(s, 1, 10.0 + s) for s in range(3, 7)] + [line(s, 2, 20.0 + s) for s in range(5, 11)]
    restore = {"event": "checkpoint_restore", "restore_s": 0.2}
    events = [
        {"time": 0.0, "event": "attempt_start", "attempt": 0, **sup},
        start(0, 0.1, 0.0),
        {"time": 5.2, "event": "fault_injected", "kind": "kill", "attempt": 0, "spec": "a"},
        {"time": 5.3, "event": "failure_detected", "attempt": 0, "detected_at": 5.3, **sup},
        {"time": 5.4, "event": "teardown_complete", "teardown_s": 0.1, **sup},
        {"time": 5.5, "event": "attempt_start", "attempt": 1, **sup},
        start(1, 11.0, 11.0),
        {"time": 12.0, "attempt": 1, "step": 2, "layout_changed": False, **restore},
        {"time": 16.5, "event": "fault_injected", "kind": "hang", "attempt": 1, "spec": "b"},
        {"time": 19.5, "event": "failure_detected", "attempt": 1, "detected_at": 19.5, **sup},
        {"time": 19.6, "event": "teardown_complete", "teardown_s": 0.1, **sup},
        {"time": 19.7, "event": "attempt_start", "attempt": 2, **sup},
        start(2, 23.0, 23.0),
        {"time": 24.0, "attempt": 2, "step": 4, "layout_changed": True, **restore},
    ]
    run = write_run(tmp_path / "run", metrics, events)
    found = incidents(run)
    assert [i.kind for i in found] == ["kill", "hang"]
    assert found[1].phases_s["detect"] == pytest.approx(3.0)
    fid = compare(run, clean(tmp_path / "ref"))
    assert fid.layout_changed and [w.layout_changed for w in fid.windows] == [False, True]
    assert [w.steps for w in fid.windows] == [2, 6]  # attempt 1 keeps steps 3-4; attempt 2 redid 5-6
    assert goodput(run, None).badput_s["detection"] == pytest.approx(0.1 + 3.0)
