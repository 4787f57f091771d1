"""The console narrates recovery (issue 24): one line per event an operator must know of, worded from
the event records the writers already make (telemetry/narrate.py). The sequences below are the event
logs of a real `launch demo --fault kill:rank=1:step=12 --fault term:step=22:restart=1`, trimmed to
the fields the lines use; tests/test_narration_live.py checks the same lines from real processes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from truestep.experiment.runner import eta_line
from truestep.parallel.peer_loss import peer_left
from truestep.telemetry.jsonl import JsonlWriter
from truestep.telemetry.narrate import LINES, Narrator
from truestep.telemetry.run_logs import RunLogs
from truestep.train.run import failure_of

GLOO = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:30410. This is typically caused by a remote worker crashing. Check the logs of the remote "
    "worker before reporting an error."
)


def said(narrator: Narrator, records: list[dict]) -> list[str]:
    out = io.StringIO()
    narrator.out = out
    for record in records:
        narrator.tell(record)
    return out.getvalue().splitlines()


def stop_sequence(signal: str, reason: str) -> list[dict]:
    return [
        {"event": "checkpoint_save", "step": 20, "reason": "interval"},
        {"event": "signal_received", "signal": signal, "stop_step": 23, "stop_reason": reason},
        {"event": "checkpoint_commit", "step": 20},  # the interval save finishing: not the stop's
        {"event": "checkpoint_save", "step": 23, "reason": reason},
        {"event": "checkpoint_commit", "step": 23},
        {"event": "run_end", "step": 23, "reason": reason},
    ]


def test_a_preemption_is_said_in_three_lines_ending_with_exit_75_and_what_to_run() -> None:
    lines = said(Narrator("truestep train", requeue_code=75), stop_sequence("SIGTERM", "preempted"))
    assert lines == [
        "truestep train: preempted (SIGTERM) at step 23: saving a checkpoint, then exit 75",
        "truestep train: saved step 23 (committed and verifiable)",
        "truestep train: exit 75 (requeue me): preempted at step 23, saved; requeue the job or run the same "
        "command again to resume from it",
    ]


def test_ctrl_c_is_said_as_saved_then_exit_130() -> None:
    lines = said(Narrator("truestep train"), stop_sequence("SIGINT", "interrupted"))
    assert lines == [
        "truestep train: interrupted (SIGINT) at step 23: saving a checkpoint, then exit 130",
        "truestep train: saved step 23 (committed and verifiable)",
        "truestep train: exit 130: interrupted at step 23, saved; run the same command again to resume",
    ]


def test_under_a_supervisor_rank_0_leaves_the_exit_line_to_it() -> None:
    lines = said(Narrator("truestep train", says_exit=False), stop_sequence("SIGTERM", "preempted"))
    assert [line.split(": ", 1)[1].split(" ")[0] for line in lines] == ["preempted", "saved"]


def test_interval_saves_and_a_completed_run_say_nothing() -> None:
    records = [
        {"event": "checkpoint_commit", "step": 5},
        {"event": "checkpoint_verified", "step": 5, "checksums": True, "verify_s": 0.1},
        {"event": "run_end", "step": 30, "reason": "completed"},
    ]
    assert said(Narrator("truestep train"), records) == []


def test_a_quarantine_and_the_fall_back_past_it_are_said_with_how_the_resume_was_verified() -> None:
    narrator = Narrator("truestep train", failure_time=lambda: 100.0)
    records = [
        {
            "event": "checkpoint_quarantined",
            "step": 10,
            "reason": "missing COMMITTED",
            "moved_to": "q/step_10",
        },
        {
            "event": "checkpoint_verified",
            "step": 5,
            "checksums": True,
            "shard_bytes": "hashed while loading",
            "verify_s": 0.04,
        },
        {
            "event": "checkpoint_restore",
            "step": 5,
            "path": "ck/step_00000005",
            "restore_s": 0.25,
            "time": 101.0,
        },
    ]
    assert said(narrator, records) == [
        "truestep train: quarantined checkpoint step 10 (missing COMMITTED); moved to q/step_10",
        "truestep train: resuming from step 5 (ck/step_00000005; verified by commit marker and manifest; every "
        "shard item's SHA-256 as it loads, in 0.0 s; "
        "loaded in 0.2 s); fell back past quarantined step 10",
    ]
    back = narrator.metrics({"step": 6, "time": 102.5})
    assert back == "back at work: step 6 done, 2.5 s after the failure was detected"
    assert narrator.metrics({"step": 7, "time": 103.0}) is None  # said once per restore


def test_a_resume_without_checksums_says_so() -> None:
    records = [
        {"event": "checkpoint_verified", "step": 5, "checksums": False, "verify_s": 0.01},
        {"event": "checkpoint_restore", "step": 5, "path": "p", "restore_s": 1.0, "time": 1.0},
    ]
    (line,) = said(Narrator("truestep train"), records)
    assert "verified by commit marker and manifest, no checksums" in line and "fell back" not in line


def supervisor_sequence(
    handoffs: int, importing: int = 0, reason: str = "process_exit on rank 1"
) -> list[dict]:
    return [
        # The first attempt's ranks forked by a template still importing: not part of any restart's line.
        *[{"event": "standby_handoff", "rank": r, "ready": False} for r in range(2)],
        {"event": "attempt_start", "attempt": 0, "time": 10.0},
        {"event": "failure_detected", "attempt": 0, "kind": "process_exit", "rank": 1,
         "detail": "exit codes {1: -9}", "detected_at": 13.25},
        {"event": "teardown_complete", "attempt": 0},
        {"event": "restart", "restart": 1, "after": "failed", "reason": reason},
        *[{"event": "standby_handoff", "rank": r, "ready": r >= importing} for r in range(handoffs)],
        {"event": "attempt_start", "attempt": 1, "time": 14.0},
        {"event": "supervisor_end", "outcome": "requeue", "exit_code": 75, "restarts": 1},
    ]  # fmt: skip


def test_the_supervisor_says_failure_restart_warm_and_the_exit_code() -> None:
    assert said(Narrator("truestep launch"), supervisor_sequence(handoffs=2)) == [
        "truestep launch: failure detected: process_exit on rank 1 after 3.2 s of attempt 0 (exit codes {1: -9})",
        "truestep launch: restarting as attempt 1 (restart 1 after process_exit on rank 1; warm: 2 rank(s) "
        "forked from the ready template)",
        "truestep launch: exit 75 (requeue me): preempted, checkpoint saved; requeue the job or run the same "
        "command again",
    ]


def test_a_restart_without_standbys_is_said_cold() -> None:
    lines = said(Narrator("truestep launch"), supervisor_sequence(handoffs=0))
    assert lines[1] == (
        "truestep launch: restarting as attempt 1 (restart 1 after process_exit on rank 1; cold: fresh processes)"
    )


@pytest.mark.parametrize(
    ("importing", "how"),
    [
        (2, "2 rank(s) forked from a template still importing: no faster than a cold start"),
        (1, "warm: 1 rank(s) forked from the ready template, 1 while it was still importing"),
    ],
)
def test_ranks_forked_by_a_template_still_importing_are_not_called_warm(importing: int, how: str) -> None:
    """`standby_handoff.ready` false: the template had not finished importing torch; the restart then
    takes as long as a cold one (0 of 64 per-slot standbys were ready in a loaded campaign)."""
    lines = said(Narrator("truestep launch"), supervisor_sequence(handoffs=2, importing=importing))
    assert (
        lines[1]
        == f"truestep launch: restarting as attempt 1 (restart 1 after process_exit on rank 1; {how})"
    )


def test_a_restart_after_ranks_stopped_for_a_signal_says_why() -> None:
    """A SIGTERM sent to one rank, not to the supervisor: the ranks agree, save and exit 75, and the
    supervisor restarts in place: the restart line says so."""
    reason = (
        "every rank stopped gracefully with exit 75 (a preemption signal reached the ranks, not this "
        "supervisor)"
    )
    sequence = [r for r in supervisor_sequence(handoffs=0, reason=reason) if r["event"] != "failure_detected"]
    lines = said(Narrator("truestep launch"), sequence)
    assert lines[0].startswith(f"truestep launch: restarting as attempt 1 (restart 1 after {reason};"), lines


def test_a_stop_at_a_step_being_saved_does_not_say_saved_before_the_commit() -> None:
    """The interval save of step 30 is under way when the stop comes at step 30: the stop skips its own
    save. "step 30 was already saved" followed by "saved step 30" contradicted itself."""
    records = [
        {"event": "checkpoint_save", "step": 30, "reason": "interval"},
        {"event": "signal_received", "signal": "SIGTERM", "stop_step": 30, "stop_reason": "preempted"},
        {"event": "checkpoint_skipped", "step": 30, "reason": "preempted"},
        {"event": "checkpoint_commit", "step": 30},
    ]
    lines = said(Narrator("truestep train", says_exit=False), records)
    assert lines[1:] == [
        "truestep train: step 30 is being saved already (an interval save): waiting for its commit",
        "truestep train: saved step 30 (committed and verifiable)",
    ]
    committed_first = [records[0], records[3], records[1], records[2]]
    lines = said(Narrator("truestep train", says_exit=False), committed_first)
    assert lines[1:] == ["truestep train: step 30 was already saved (committed and verifiable)"]


def test_rank_and_supervisor_kinds_do_not_overlap_so_nothing_is_said_twice() -> None:
    rank_kinds = {"signal_received", "checkpoint_commit", "checkpoint_skipped", "run_end",
                  "checkpoint_quarantined", "checkpoint_verified", "checkpoint_restore", "nan_rollback",
                  "memory_restore", "memory_estimate", "init_from", "run_start", "eval",
                  "exit_deadline_beyond_lead_time"}  # fmt: skip
    supervisor_kinds = {"attempt_start", "standby_handoff", "restart", "failure_detected", "supervisor_end",
                        "memory_lost"}  # fmt: skip
    assert set(LINES) == rank_kinds | supervisor_kinds


def test_narration_can_be_switched_off() -> None:
    assert said(Narrator("truestep train", enabled=False), stop_sequence("SIGTERM", "preempted")) == []


def test_run_logs_narrate_on_stderr_and_find_the_supervisors_failure_time(tmp_path: Path, capsys) -> None:
    supervisor = JsonlWriter(tmp_path / "events.jsonl", {"source": "supervisor"})
    supervisor.write({"event": "failure_detected", "attempt": 0, "detected_at": 50.0})
    supervisor.write({"event": "failure_detected", "attempt": 1, "detected_at": 90.0})  # a later attempt's
    supervisor.close()
    logs = RunLogs(tmp_path, attempt=1, enabled=True, narrator=Narrator("truestep train"))
    logs.event("signal_received", signal="SIGTERM", stop_step=4, stop_reason="preempted")
    logs.close()
    assert logs.failure_time() == 50.0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        captured.err == "truestep train: preempted (SIGTERM) at step 4: saving a checkpoint, then exit 75\n"
    )
    quiet = RunLogs(tmp_path, attempt=1, enabled=False, narrator=Narrator("truestep train"))
    quiet.event("signal_received", signal="SIGTERM", stop_step=4, stop_reason="preempted")  # not rank 0
    assert capsys.readouterr().err == ""


def test_a_peer_that_left_is_one_line_not_a_traceback() -> None:
    err = RuntimeError(GLOO)
    assert peer_left(err) == "Connection closed by peer [127.0.0.1]:30410"
    assert failure_of(err) == (
        1,
        "stopping: a peer rank left the process group (it exited or was killed; gloo: Connection closed by "
        "peer [127.0.0.1]:30410); details in events.jsonl",
    )
    # Under a supervisor the other rank's failure is the supervisor's to say: no network-looking words.
    assert failure_of(err, supervised=True) == (
        1,
        "stopping: another rank of this job failed (see the supervisor's 'failure detected' line); "
        "details in events.jsonl",
    )
    wrapped = ValueError("while saving")
    wrapped.__cause__ = RuntimeError("[x.cc:1] Connection reset by peer")
    assert failure_of(wrapped) is not None


@pytest.mark.parametrize("err", [RuntimeError("shape mismatch"), ValueError("Connection closed by peer")])
def test_anything_else_keeps_its_traceback(err: BaseException) -> None:
    assert peer_left(err) is None and failure_of(err) is None


def test_the_experiment_estimates_what_is_left() -> None:
    assert eta_line([30.0, 50.0], 5) == "3 run(s) left, about 2 min 00 s (then the report)"
    assert eta_line([10.0], 3) == "2 run(s) left, about 20 s (then the report)"
    assert eta_line([10.0, 10.0], 2) == "all runs done; the report comes next"


def test_a_preemption_whose_stop_failed_does_not_say_checkpoint_saved() -> None:
    """The atomic-commit ablation's graceful cell: rank 0 crashes inside the stop's save; the supervisor,
    preempted itself, still exits 75, but "checkpoint saved" was not true."""
    end = {"event": "supervisor_end", "outcome": "requeue", "exit_code": 75, "restarts": 0,
           "after_failure": "process_exit on rank 0"}  # fmt: skip
    (line,) = said(Narrator("truestep launch"), [end])
    assert line == (
        "truestep launch: exit 75 (requeue me): preempted, but a rank failed while the job stopped "
        "(process_exit on rank 0), so its checkpoint may not be saved; requeue the job or run the same "
        "command again: it resumes from the newest verified checkpoint"
    )
