"""The instrument on recoveries from peers' memory (issue 36 item 4), on hand-made run directories: a
`memory_restore` is a resume, a restore span and the restore phase of its incident like a
`checkpoint_restore`, and every recovery says where it came from and how many steps it lost."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from analysis_cases import clean, killed_and_resumed, line, loss_of, restarted_from_scratch, start, write_run
from truestep.analysis.fidelity import compare
from truestep.analysis.floor import measure_floor
from truestep.analysis.goodput import goodput
from truestep.analysis.mttr import incidents
from truestep.analysis.report import Table, render_run_text
from truestep.analysis.report.opening import ablation_sentences
from truestep.analysis.report.recovery import recovery_rows
from truestep.analysis.report.sections import ablation_blocks
from truestep.analysis.restores import StepsLost, steps_lost
from truestep.analysis.runlog import RunLog, RunLogError
from truestep.analysis.summary import analyze_group, analyze_run
from truestep.analysis.verdict import CellVerdict, Status, judge, judge_experiment
from truestep.config.load import load_config
from truestep.experiment.plan import ABLATION_ROWS, plan_jobs

MEMORY_RESTORE = {
    "time": 10.0,
    "event": "memory_restore",
    "attempt": 1,
    "step": 5,
    "source": "memory",
    "restore_s": 0.25,
    "steps_lost": 1,
    "sources": {"0": 0, "1": 0},
    "from_buddies": [1],
    "layout_changed": False,
}


def from_memory(path: Path, **changes: object) -> RunLog:
    """killed_and_resumed (attempt 0 killed at 7.5 after logging steps 1-6, attempt 1 back at step 5 by
    10.0), its restore from peers' memory instead of the disk."""
    disk = killed_and_resumed(path.parent / f"{path.name}-disk")
    events = [copy.deepcopy(e) for e in disk.events if e["event"] != "checkpoint_restore"]
    events.append({**MEMORY_RESTORE, **changes})
    events = [{k: v for k, v in e.items() if v is not None} for e in events]
    return write_run(path, disk.metrics, sorted(events, key=lambda e: e["time"]))


def test_a_memory_restore_is_the_restore_phase_of_its_incident(tmp_path: Path) -> None:
    [inc] = incidents(from_memory(tmp_path / "run"))
    # As from disk: relaunch 8.6 -> restored 10.0; without it, the phase was unknown and the first step
    # was timed from the relaunch.
    assert inc.phases_s == pytest.approx(
        {"detect": 0.5, "teardown": 0.5, "relaunch": 0.1, "restore": 1.4, "first_step": 1.5}
    )
    assert (inc.restore_source, inc.restore_s, inc.steps_lost) == ("memory", 0.25, 1)
    [disk] = incidents(killed_and_resumed(tmp_path / "disk"))
    assert (disk.restore_source, disk.restore_s) == ("disk", 0.5)
    assert disk.steps_lost == 1  # no steps_lost in the event: attempt 0 logged step 6, restored 5


def test_a_fresh_start_after_a_failure_lost_every_step(tmp_path: Path) -> None:
    [inc] = incidents(restarted_from_scratch(tmp_path / "run", 4))
    assert (inc.restore_source, inc.restore_s, inc.steps_lost) == (None, None, 3)


def test_goodput_counts_the_memory_restore_and_the_steps_it_lost(tmp_path: Path) -> None:
    g = goodput(from_memory(tmp_path / "run"), violation=None)
    assert g.badput_s["restore"] == pytest.approx(0.25)
    # startup: 1.0 before step 1, then 9.0 -> 10.5 less the 0.25 s restore
    assert g.badput_s["startup"] == pytest.approx(1.0 + 1.5 - 0.25)
    assert g.steps_lost == StepsLost([1], ["memory"])


def test_steps_lost_per_recovery_and_its_source(tmp_path: Path) -> None:
    """Two failures: the first restored from memory, the second from disk; a NaN rollback later in an
    attempt is no recovery; an event without steps_lost gets it from the metrics."""
    sup = {"source": "supervisor"}
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 8)]
    metrics += [line(s, 1, 10.0 + s) for s in range(7, 13)] + [line(s, 2, 30.0 + s) for s in range(4, 16)]
    events = [
        start(0, 0.1, 0.0),
        {"time": 8.5, "event": "failure_detected", "attempt": 0, "detected_at": 8.5, **sup},
        start(1, 15.0, 15.0),
        {"time": 16.0, "event": "memory_restore", "attempt": 1, "step": 6, "restore_s": 0.2, "steps_lost": 1},
        {"time": 22.5, "event": "checkpoint_restore", "attempt": 1, "step": 10, "restore_s": 0.3},
        {"time": 23.5, "event": "failure_detected", "attempt": 1, "detected_at": 23.5, **sup},
        start(2, 33.0, 33.0),
        {"time": 33.5, "event": "checkpoint_restore", "attempt": 2, "step": 3, "restore_s": 0.4},
    ]
    lost = steps_lost(write_run(tmp_path / "run", metrics, events))
    assert lost == StepsLost([1, 9], ["memory", "disk"])  # attempt 1 logged up to 12, restored 3
    assert lost.mean == 5 and lost.most == 9 and lost.by_source() == {"memory": 1, "disk": 1}


def test_a_memory_restore_is_a_resume_and_opens_a_window(tmp_path: Path) -> None:
    run = from_memory(tmp_path / "run")
    [window] = compare(run, clean(tmp_path / "ref")).windows
    assert window.resumed_at == 5 and window.steps == 5
    analysis = analyze_run("run", run, None, None)
    assert analysis.resumes == 1


def test_a_reference_restored_from_memory_is_refused(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    metrics, events = ref.metrics, [*ref.events, {**MEMORY_RESTORE, "attempt": 0, "time": 3.5}]
    with pytest.raises(RunLogError, match="resumed"):
        measure_floor(write_run(tmp_path / "bad", metrics, events), [])


def test_the_report_says_where_each_recovery_came_from_and_what_it_lost(tmp_path: Path) -> None:
    run = from_memory(tmp_path / "run")
    text = render_run_text(analyze_run("run", run, None, None))
    assert "steps lost per recovery: 1 (1 from memory)" in text
    assert "restore 0.250 s from memory, 1 step(s) lost" in text
    rows = recovery_rows(run.path)
    assert rows[0][:3] == ["1", "restored from memory", "5"]
    assert "rank 1" in rows[0][3] and "1 step(s) lost" in rows[0][3]
    disk = render_run_text(analyze_run("disk", killed_and_resumed(tmp_path / "disk"), None, None))
    assert "steps lost per recovery: 1 (1 from disk)" in disk


def _cells_run(path: Path, event: dict) -> RunLog:
    """A killed and resumed run (bitwise the reference's steps) whose one restore is `event`."""
    disk = killed_and_resumed(path.parent / f"{path.name}-base")
    events = [e for e in disk.events if e["event"] != "checkpoint_restore"] + [event]
    return write_run(path, disk.metrics, sorted(events, key=lambda e: e["time"]))


def test_peer_snapshots_off_is_a_row_only_when_snapshots_are_on() -> None:
    def rows(*overrides: str, **kw: object) -> list[str]:
        jobs = plan_jobs("demo", list(overrides), 2, [], ablation=True, **kw)  # type: ignore[arg-type]
        return list(dict.fromkeys(j.row for j in jobs if j.role == "ablation"))

    assert "peer-snapshots-off" not in rows()  # the default keeps snapshots off: the matrix is unchanged
    on = rows("--resilience.snapshot_every_steps=2")
    assert on == [*ABLATION_ROWS, "peer-snapshots-off"]
    [cell] = [
        j
        for j in plan_jobs("demo", ["--resilience.snapshot_every_steps=2"], 2, [], ablation=True)
        if j.row == "peer-snapshots-off" and j.mode == "hard"
    ]
    assert load_config("demo", cell.overrides).resilience.snapshot_every_steps == 0
    assert cell.faults == ["kill:rank=1:step=13"]
    assert rows("--resilience.snapshot_every_steps=2", ablation_rows=["all-on"]) == ["all-on"]


def test_a_flagged_peer_snapshots_off_cell_fails_the_experiment(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    wrong = killed_and_resumed(tmp_path / "wrong", later_loss=lambda s: loss_of(s) + 1e-3)
    v = judge(compare(wrong, ref), measure_floor(ref, []))
    assert v.status is Status.VIOLATED
    failed = judge_experiment({}, [CellVerdict("peer-snapshots-off", "hard", "wrong", v)])
    assert failed.head == "FAIL" and failed.failures == [f"peer-snapshots-off `wrong` {v.label}"]
    # A correctness row off and flagged is what the ablation expects, not a failure.
    assert judge_experiment({}, [CellVerdict("optimizer-restore-off", "hard", "wrong", v)]).head != "FAIL"


def test_the_report_shows_what_peer_snapshots_buy(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    on = _cells_run(tmp_path / "on", dict(MEMORY_RESTORE))
    off_event = {
        "time": 10.0,
        "event": "checkpoint_restore",
        "attempt": 1,
        "step": 5,
        "source": "disk",
        "restore_s": 0.5,
        "steps_lost": 4,
        "layout_changed": False,
    }
    off = _cells_run(tmp_path / "off", off_event)
    cells = [("all-on", "hard", "on"), ("peer-snapshots-off", "hard", "off")]
    group = analyze_group("ref", ref, {}, {"on": ("ablation", on), "off": ("ablation", off)}, cells)
    assert group.verdict.head != "FAIL" and not any(c.flagged for c in group.cells)
    text = " ".join(ablation_sentences(group))
    assert (
        "With peer snapshots off (a failure recovers from disk instead of peers' memory) the cells stayed correct"
        in text
    )
    assert "peer-snapshots-off/hard: steps lost per recovery 4 (1 from disk)" in text
    assert "all-on/hard: 1 (1 from memory)" in text
    assert "Not flagged although a mechanism was off" not in text  # a cost row is meant to pass
    [table] = [b for b in ablation_blocks(group) if isinstance(b, Table) and "steps lost: row" in b.headers]
    assert table.rows[0][2].startswith("ok (bitwise")
    assert table.rows == [
        [
            "`peer-snapshots-off`",
            "hard",
            table.rows[0][2],
            "4 (1 from disk)",
            "1 (1 from memory)",
            "4.00 s",
            "4.00 s",
        ]
    ]
