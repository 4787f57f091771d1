"""A line on stderr is one write (core/say.py, the narrator): with PYTHONUNBUFFERED each write call is its
own write(2), and another process's line can land between a line and a newline written apart."""

from __future__ import annotations

import io

from truestep.core.say import say
from truestep.telemetry.narrate import Narrator


class Calls(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, s: str) -> int:
        self.calls.append(s)
        return super().write(s)


def assert_whole_lines(calls: list[str]) -> None:
    written = [c for c in calls if c]
    assert written and all(c.endswith("\n") and c.count("\n") == 1 for c in written), calls


def test_say_writes_the_line_and_its_newline_in_one_call() -> None:
    out = Calls()
    say("truestep train: rank 1: stopping", out)
    assert_whole_lines(out.calls)


def test_the_narrators_lines_are_one_write_each() -> None:
    out = Calls()
    narrator = Narrator("truestep launch", out=out)
    said = narrator.tell({"event": "failure_detected", "kind": "process_exit", "rank": 1, "detail": "x"})
    assert said is not None
    narrator.restored_at = 1.0
    assert narrator.metrics({"event": "step", "step": 6, "time": 2.0}) is not None
    assert_whole_lines(out.calls)
