"""Incidents come from what the supervisor saw, not only from what was injected (issue 40): in production
no fault is injected, and every failure the supervisor detected, every preemption and every vanished job
that was started again is an incident with its MTTR phases. Hand-made run directories on a simulated
clock (analysis_cases.py), answers worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis_cases import line, start, write_run
from truestep.analysis.goodput import goodput
from truestep.analysis.mttr import incidents
from truestep.analysis.report.text import render_run_text
from truestep.analysis.summary import analyze_run

SUP = {"source": "supervisor"}


def killed_from_outside(path: Path, extra: list[dict] | None = None, handoff: bool = True) -> object:
    """Rank 1 SIGKILLed by someone else at ~7.45 (no fault_injected): attempt 0 trains steps 1-6 (step k
    ends at 1+k), commits step 5; the supervisor's last poll that found every rank running was at 7.4,
    it detects the exit at 7.5, tears down by 8.0; a standby still importing is handed rank 0 at 8.1
    (attempt_start 8.1), finishes importing at 10.0 (process_start), restores step 5 by 10.5 and
    recomputes 6-10 ending at 11.5..15.5."""
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 7)] + [line(s, 1, 11.5 + s - 6) for s in range(6, 11)]
    resumed = start(1, 10.6, 10.0)
    if handoff:
        resumed["handoff_at"] = 8.1
    events = [
        {"time": 0.0, "event": "supervisor_start", **SUP},
        {"time": 0.0, "event": "attempt_start", "attempt": 0, **SUP},
        start(0, 0.5, 0.0),
        {"time": 6.1, "event": "checkpoint_save", "attempt": 0, "step": 5, "blocking_s": 0.0},
        {"time": 6.2, "event": "checkpoint_commit", "attempt": 0, "step": 5},
        {"time": 7.5, "event": "failure_detected", "attempt": 0, "kind": "process_exit", "rank": 1,
         "detected_at": 7.5, "last_seen": 7.4, "exit_codes": {"0": None, "1": -9}, **SUP},
        {"time": 8.0, "event": "teardown_complete", "attempt": 0, "teardown_s": 0.5, **SUP},
        {"time": 8.0, "event": "restart", "restart": 1, "after": "failed", **SUP},
        {"time": 8.1, "event": "standby_handoff", "rank": 0, "ready": False, "sent_at": 8.1, **SUP},
        {"time": 8.1, "event": "attempt_start", "attempt": 1, **SUP},
        resumed,
        {"time": 10.5, "event": "checkpoint_restore", "attempt": 1, "step": 5, "restore_s": 0.4},
        {"time": 15.6, "event": "run_end", "attempt": 1, "step": 10, "reason": "completed"},
        *(extra or []),
    ]  # fmt: skip
    return write_run(path, metrics, events)


def test_a_failure_nobody_injected_is_an_incident_with_its_phases(tmp_path: Path) -> None:
    run = killed_from_outside(tmp_path / "run")
    [inc] = incidents(run)
    assert (inc.kind, inc.origin, inc.attempt, inc.pre_fault_step) == ("process_exit", "detected", 0, 6)
    assert inc.fault_time == pytest.approx(7.4)  # the last poll that found the rank running
    assert inc.phases_s == pytest.approx(
        {"detect": 0.1, "teardown": 0.5, "relaunch": 0.1, "restore": 2.4, "first_step": 1.0}
    )
    assert inc.mttr_s == pytest.approx(11.5 - 7.4) and inc.regain_s == pytest.approx(11.5 - 7.4)
    text = render_run_text(analyze_run("run", run, None, None), ["mttr"])
    assert "faults: none injected; failures detected: 1" in text, text
    assert "process_exit (detected) at step 6: 4.10 s" in text, text


def test_every_nodes_record_of_one_failure_is_one_incident(tmp_path: Path) -> None:
    """Node 1's supervisor sees the same attempt fail (its ranks lost their peer) a little later."""
    node1 = {"time": 7.6, "event": "failure_detected", "attempt": 0, "kind": "process_exit", "rank": 3,
             "detected_at": 7.6, "last_seen": 7.5, "source": "supervisor", "node": 1}  # fmt: skip
    [inc] = incidents(killed_from_outside(tmp_path / "run", [node1]))
    assert inc.fault_time == pytest.approx(7.4) and inc.phases_s["detect"] == pytest.approx(0.1)


def test_without_last_seen_the_incident_starts_at_its_detection(tmp_path: Path) -> None:
    """A supervisor that recorded no last sign of health: MTTR from the detection, detect unknown."""
    run = killed_from_outside(tmp_path / "run")
    events = [{k: v for k, v in e.items() if k != "last_seen"} for e in run.events]
    [inc] = incidents(write_run(tmp_path / "old", run.metrics, events))
    assert inc.fault_time == pytest.approx(7.5) and inc.phases_s["detect"] is None
    assert inc.phases_s["teardown"] == pytest.approx(0.5) and inc.mttr_s == pytest.approx(4.0)


def test_a_standbys_import_after_its_handoff_is_startup_not_requeue_wait(tmp_path: Path) -> None:
    """The handed-over standby finished importing 1.9 s after the handoff: the job was not waiting for a
    relaunch then (it had been relaunched), its new rank was starting."""
    g = goodput(killed_from_outside(tmp_path / "run"), None)
    assert g.badput_s["requeue_wait"] == pytest.approx(0.1)  # teardown done 8.0 -> handoff 8.1
    assert g.badput_s["detection"] == pytest.approx(0.1)  # last seen running 7.4 -> detected 7.5
    # start-up: 1.0 before step 1; attempt 1: 8.1 -> 10.5 less the 0.4 restore, then 10.5 -> 10.5
    assert g.badput_s["startup"] == pytest.approx(1.0 + 2.0)
    assert g.attempts[1] == pytest.approx(8.1)
    older = goodput(killed_from_outside(tmp_path / "old", handoff=False), None)
    assert older.badput_s["requeue_wait"] == pytest.approx(2.0)  # a run from before handoff_at


def preempted(path: Path, signal_to_supervisor: bool) -> object:
    """Attempt 0 trains steps 1-6; a SIGTERM at 6.3 (to the supervisor, or to one rank only); the ranks
    agree at 6.4, save step 7 and end at 8.0 (exit 75). Relaunched (a requeue, or a restart in place) at
    9.0; attempt 1 starts at 9.5, restores step 7 by 10.0, trains 8-10."""
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 8)] + [line(s, 1, 10.0 + s - 7) for s in range(8, 11)]
    signal = (
        [{"time": 6.3, "event": "supervisor_signal", "signal": "SIGTERM", **SUP}]
        if signal_to_supervisor
        else []
    )
    events = [
        {"time": 0.0, "event": "supervisor_start", **SUP},
        {"time": 0.0, "event": "attempt_start", "attempt": 0, **SUP},
        start(0, 0.5, 0.0),
        *signal,
        {"time": 6.4, "event": "signal_received", "attempt": 0, "signal": "SIGTERM", "stop_step": 7},
        {"time": 7.9, "event": "checkpoint_commit", "attempt": 0, "step": 7},
        {"time": 8.0, "event": "run_end", "attempt": 0, "step": 7, "reason": "preempted"},
        {"time": 9.0, "event": "attempt_start", "attempt": 1, **SUP},
        start(1, 9.6, 9.5),
        {"time": 10.0, "event": "checkpoint_restore", "attempt": 1, "step": 7, "restore_s": 0.3},
        {"time": 13.1, "event": "run_end", "attempt": 1, "step": 10, "reason": "completed"},
    ]
    return write_run(path, metrics, events)


@pytest.mark.parametrize("to_supervisor", [True, False])
def test_a_preemption_nobody_injected_is_an_incident(tmp_path: Path, to_supervisor: bool) -> None:
    [inc] = incidents(preempted(tmp_path / "run", to_supervisor))
    assert (inc.kind, inc.origin, inc.attempt, inc.pre_fault_step) == ("preempted", "relaunch", 0, 5)
    t0 = 6.3 if to_supervisor else 6.4
    assert inc.fault_time == pytest.approx(t0)
    assert inc.phases_s == pytest.approx(
        {"detect": 6.4 - t0, "teardown": 1.6, "relaunch": 1.0, "restore": 1.0, "first_step": 1.0}
    )


def test_a_job_that_vanished_and_was_started_again_is_an_incident(tmp_path: Path) -> None:
    """The whole job SIGKILLed (no supervisor left to say anything) after step 6; a scheduler starts it
    again at 20.0: from its last record, with the moment it died unknown."""
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 7)] + [line(s, 1, 22.0 + s - 6) for s in range(6, 9)]
    events = [
        {"time": 0.0, "event": "attempt_start", "attempt": 0, **SUP},
        start(0, 0.5, 0.0),
        {"time": 6.2, "event": "checkpoint_commit", "attempt": 0, "step": 5},
        {"time": 20.0, "event": "supervisor_start", **SUP},
        {"time": 20.0, "event": "attempt_start", "attempt": 1, **SUP},
        start(1, 21.0, 20.5),
        {"time": 21.5, "event": "checkpoint_restore", "attempt": 1, "step": 5, "restore_s": 0.5},
    ]
    [inc] = incidents(write_run(tmp_path / "run", metrics, events))
    assert (inc.kind, inc.origin, inc.fault_time) == ("lost", "relaunch", 7.0)
    assert inc.phases_s["detect"] is None and inc.phases_s["teardown"] is None
    assert inc.phases_s["relaunch"] == pytest.approx(13.0) and inc.mttr_s == pytest.approx(22.0 - 7.0)


def restored_without_commit_event(path: Path, evidence: str) -> object:
    """Attempt 0 committed step 5 (event) and wrote step 10's marker, then rank 0 was killed before it
    logged step 10's commit; attempt 1 restored step 10."""
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 12)] + [line(s, 1, 20.0 + s) for s in range(11, 13)]
    events = [
        {"time": 0.0, "event": "attempt_start", "attempt": 0, **SUP},
        start(0, 0.5, 0.0),
        {"time": 6.2, "event": "checkpoint_commit", "attempt": 0, "step": 5},
        {"time": 12.5, "event": "failure_detected", "attempt": 0, "kind": "process_exit", "rank": 0,
         "detected_at": 12.5, **SUP},
        {"time": 12.6, "event": "teardown_complete", "attempt": 0, "teardown_s": 0.1, **SUP},
        {"time": 13.0, "event": "attempt_start", "attempt": 1, **SUP},
        start(1, 20.0, 19.0),
        {"time": 19.9, "event": "checkpoint_restore", "attempt": 1, "step": 10, "restore_s": 0.5,
         "path": str(path / "checkpoints" / "step_00000010")},
    ]  # fmt: skip
    if evidence == "verified":
        events.insert(-1, {"time": 19.5, "event": "checkpoint_verified", "attempt": 1, "step": 10})
    run = write_run(path, metrics, events)
    if evidence == "marker":
        (path / "checkpoints" / "step_00000010").mkdir(parents=True)
        (path / "checkpoints" / "step_00000010" / "COMMITTED").write_text("{}")
    return run


@pytest.mark.parametrize(
    ("evidence", "says"),
    [
        ("verified", "committed: its commit marker, verified at a resume"),
        ("marker", "committed: its commit marker on disk"),
        ("none", "NOT known to be committed"),  # checkpoint.atomic_commit=false restores a torn one
    ],
)
def test_a_restore_of_a_commit_with_no_event_is_a_restore_of_a_commit(
    tmp_path: Path, evidence: str, says: str
) -> None:
    from truestep.analysis.report.recovery import recovery_rows

    run = restored_without_commit_event(tmp_path / "run", evidence)
    commits = run.commit_evidence()
    assert commits[5] == "its checkpoint_commit event"
    assert (10 in commits) is (evidence != "none")
    [restored] = [r for r in recovery_rows(run.path, commits) if r[1] == "restored"]
    assert restored[2] == "10" and says in restored[3], restored


def test_the_verdict_sentence_counts_injected_faults_apart_from_other_failures(tmp_path: Path) -> None:
    from analysis_cases import clean, killed_and_resumed
    from truestep.analysis.report.opening import faulted_sentence

    run = killed_and_resumed(tmp_path / "run")
    extra = {"time": 12.0, "event": "failure_detected", "attempt": 1, "kind": "stale_heartbeat", "rank": 0,
             "detected_at": 12.0, "last_seen": 9.5, **SUP}  # fmt: skip
    run = write_run(tmp_path / "more", run.metrics, [*run.events, extra])
    analysis = analyze_run("more", run, clean(tmp_path / "ref"), None, "faulted", read_state=False)
    assert [(i.kind, i.origin) for i in analysis.incidents] == [
        ("kill", "injected"),
        ("stale_heartbeat", "detected"),
    ]
    text = faulted_sentence(analysis)
    assert (
        "after 1 injected fault (kill), 1 failure nobody injected (stale_heartbeat) and 1 resume" in text
    ), text
