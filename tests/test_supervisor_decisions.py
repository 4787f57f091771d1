"""The supervisor's decisions as units, in-process: how an attempt ends from its ranks' exit codes
(supervisor/watch.py: `rank_exits`), and what the restart loop does with each end (restart, give up,
stop and pass a code on). The loop runs for real -- lease, events, the node checks before a restart --
with only its driver (spawning and watching rank processes) replaced by a script of attempt ends; the
multi-process tests (test_resilience.py, test_node_loss.py, ...) show the same decisions on real ranks.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from truestep.config.load import load_config
from truestep.core.errors import ExitCode, Outcome
from truestep.supervisor.node_loss import NodeLoss
from truestep.supervisor.restart_loop import LaunchSpec, Supervisor, restart_reason, run_supervisor
from truestep.supervisor.watch import AttemptEnd, Failure, rank_exits
from truestep.telemetry.jsonl import read_jsonl

CUSTOM = 85

# ---------------------------------------------------------------------------------------- rank_exits
# (exit codes by rank, requeue code) -> (outcome, code passed on, failed rank) or None (still running)
CASES: list[tuple[dict[int, int | None], int, tuple[Outcome, int | None, int | None] | None]] = [
    ({0: None, 1: None}, 75, None),
    ({0: 0, 1: None}, 75, None),  # one finished, the other still running: wait
    ({0: 0, 1: 0}, 75, (Outcome.CLEAN, None, None)),
    ({0: 0, 1: 75}, 75, (Outcome.REQUEUE, None, None)),
    ({0: 76, 1: 75}, 75, (Outcome.REQUEUE, None, None)),
    ({0: 130, 1: 75}, 75, (Outcome.INTERRUPTED, None, None)),
    ({0: 0, 1: 130}, 75, (Outcome.INTERRUPTED, None, None)),
    ({0: None, 1: 1}, 75, (Outcome.FAILED, None, 1)),  # a crash fails the attempt at once
    ({0: 1, 1: -9}, 75, (Outcome.FAILED, None, 1)),  # the rank killed by a signal is the likely origin
    ({0: None, 1: 77}, 75, (Outcome.FAILED, None, 1)),
    ({0: None, 1: 3}, 75, (Outcome.REFUSED, 3, None)),  # a refusal stops at once, with its code
    ({0: 6, 1: 3}, 75, (Outcome.REFUSED, 3, None)),  # several: the lowest
    ({0: 6, 1: -9}, 75, (Outcome.STORAGE, 6, None)),  # a refusal wins over a crash: a retry cannot help
    ({0: 5, 1: None}, 75, (Outcome.FENCED, 5, None)),
    ({0: 85, 1: 86}, CUSTOM, (Outcome.REQUEUE, None, None)),  # the configured requeue code
    ({0: 85, 1: None}, CUSTOM, None),
    ({0: 75, 1: None}, CUSTOM, (Outcome.FAILED, None, 0)),  # 75 is no requeue under a custom code
    ({0: 85, 1: None}, 75, (Outcome.FAILED, None, 0)),
]


@pytest.mark.parametrize("codes, requeue_code, expected", CASES)
def test_how_an_attempt_ends_from_its_ranks_exit_codes(
    codes: dict[int, int | None], requeue_code: int, expected: tuple | None
) -> None:
    end = rank_exits(codes, requeue_code)
    if expected is None:
        assert end is None
        return
    assert end is not None
    outcome, code, rank = expected
    assert (end.outcome, end.code) == (outcome, code)
    assert (end.failure.rank if end.failure else None) == rank
    if end.failure is not None:
        assert end.failure.kind == "process_exit"


def test_the_supervisors_words_for_an_end() -> None:
    words = {o: AttemptEnd(o).word for o in Outcome}
    assert words[Outcome.CLEAN] == "completed" and words[Outcome.FAILED] == "failed"
    assert words[Outcome.REQUEUE] == "requeue" and words[Outcome.NODE_LOST] == "node_lost"
    assert AttemptEnd(Outcome.STORAGE, code=6).word == "refused"


# ---------------------------------------------------------------------------------------- the loop


@pytest.fixture
def no_signal_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor installs its preemption handlers; not in the test process."""
    monkeypatch.setattr(signal, "signal", lambda *args: None)


def _crash(rank: int = 1) -> Failure:
    return Failure("process_exit", rank, "exit codes {1: -9}")


class Script:
    """A RankDriver (supervisor/driver.py) whose attempts end as the script says: no process is started."""

    def __init__(self, supervisor: Supervisor, ends: Iterator[AttemptEnd], signalled: str | None) -> None:
        self.supervisor = supervisor
        self.ends = ends
        self.signalled = signalled

    def spawn(self, attempt: int) -> list:
        return []

    def watch(self, ranks: list) -> AttemptEnd:
        if self.signalled:  # the supervisor got a preemption signal while this attempt ran
            self.supervisor.signalled = self.signalled
        return next(self.ends)

    def teardown(self, ranks: list) -> None:
        pass

    def wait(self, ranks: list) -> None:
        pass


def run_script(
    tmp_path: Path,
    ends: list[AttemptEnd],
    max_restarts: int = 3,
    requeue_code: int = 75,
    signalled: str | None = None,
) -> tuple[int, list[dict]]:
    """Run the real restart loop where every attempt ends as the next of `ends` says."""
    cfg = load_config("tiny", [f"--run.dir={tmp_path}", f"--resilience.requeue_exit_code={requeue_code}"])
    spec = LaunchSpec(nproc=1, max_restarts=max_restarts, job_id="job")
    code = run_supervisor(spec, cfg, lambda supervisor: Script(supervisor, iter(ends), signalled))
    return code, [e for e in read_jsonl(tmp_path / "events.jsonl") if e.get("source") == "supervisor"]


def _end(events: list[dict]) -> tuple:
    end = events[-1]
    assert end["event"] == "supervisor_end"
    return end["outcome"], end["exit_code"], end["restarts"], end["attempt"]


LOOP = [
    # ends of successive attempts, max restarts, requeue code -> (outcome, exit code, restarts)
    ([AttemptEnd(Outcome.CLEAN)], 3, 75, ("completed", 0, 0)),
    ([AttemptEnd(Outcome.FAILED, _crash()), AttemptEnd(Outcome.CLEAN)], 3, 75, ("completed", 0, 1)),
    ([AttemptEnd(Outcome.FAILED, _crash())] * 3, 2, 75, ("gave_up", 1, 2)),
    ([AttemptEnd(Outcome.REQUEUE)] * 2, 1, 75, ("gave_up", 75, 1)),  # still asks for a requeue
    ([AttemptEnd(Outcome.REQUEUE)] * 2, 1, CUSTOM, ("gave_up", CUSTOM, 1)),
    ([AttemptEnd(Outcome.REFUSED, code=3)], 3, 75, ("refused", 3, 0)),
    ([AttemptEnd(Outcome.STORAGE, code=6)], 3, 75, ("refused", 6, 0)),
    ([AttemptEnd(Outcome.INTERRUPTED)], 3, 75, ("interrupted", 130, 0)),
]


@pytest.mark.parametrize("ends, max_restarts, requeue_code, expected", LOOP)
def test_what_the_restart_loop_does_with_each_end(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_signal_handlers: None,
    ends: list[AttemptEnd],
    max_restarts: int,
    requeue_code: int,
    expected: tuple,
) -> None:
    code, events = run_script(tmp_path, ends, max_restarts, requeue_code)
    outcome, exit_code, restarts, attempt = _end(events)
    assert (outcome, exit_code, restarts) == expected and code == exit_code
    assert attempt == restarts  # one attempt per restart, numbered by the lease from 0
    assert [e["after"] for e in events if e["event"] == "restart"] == [ends[i].word for i in range(restarts)]
    failures = [e for e in events if e["event"] == "failure_detected"]
    assert len(failures) == sum(1 for e in ends[: restarts + 1] if e.failure is not None)


def test_a_supervisor_being_preempted_asks_for_a_requeue_instead_of_restarting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_signal_handlers: None
) -> None:
    ends = [AttemptEnd(Outcome.FAILED, _crash()), AttemptEnd(Outcome.CLEAN)]
    code, events = run_script(tmp_path, ends, requeue_code=CUSTOM, signalled="SIGTERM")
    assert _end(events)[:3] == ("requeue", CUSTOM, 0) and code == CUSTOM


def test_a_lost_node_passes_its_code_on_with_the_jobs_requeue_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_signal_handlers: None
) -> None:
    """Node 1 left preempted (the custom requeue code): this node follows with the same code; a node
    gone without a goodbye: 77."""
    for left, expected in ((CUSTOM, CUSTOM), (None, ExitCode.NODE_LOST), (ExitCode.STORAGE, 6)):
        loss = NodeLoss(1, "h", "left" if left is not None else "closed", "gone", code=left)
        ends = [AttemptEnd(Outcome.NODE_LOST, Failure("node_lost", None, loss.describe(), loss=loss))]
        run_dir = tmp_path / str(left)
        code, events = run_script(run_dir, ends, requeue_code=CUSTOM)
        assert _end(events)[:2] == ("node_lost", expected) and code == expected


def test_a_restart_says_why() -> None:
    """Ranks that all exit 75 while the supervisor got no signal (a SIGTERM sent to one rank) restart in
    place: the reason says so (it used to say nothing); a failure names its kind and rank."""
    every = rank_exits({0: 75, 1: 75}, 75)
    assert every is not None and every.word == "requeue"
    assert restart_reason(every, 75) == (
        "every rank stopped gracefully with exit 75 (a preemption signal reached the ranks, not this supervisor)"
    )
    killed = rank_exits({0: None, 1: -9}, 75)
    assert killed is not None and restart_reason(killed, 75) == "process_exit on rank 1"
