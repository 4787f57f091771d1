"""The resume reads its own logs back (telemetry/jsonl.py `iter_jsonl`), and a log is narrative, not an
authority: whatever someone (or a full disk) put in events.jsonl or metrics.jsonl -- a line of garbage,
of deeply nested JSON, of invalid UTF-8, a line of megabytes, a torn last line, a 16 GiB file, a FIFO --
the reader stays bounded in memory and time and never raises for what a line holds (a traceback there
was exit 1 on every attempt: a requeue loop). Bad lines are skipped, counted and said once; a log that
is not a regular file is refused (exit 3). And a rank resumes through such logs bit for bit."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harness import INPROCESS_JOB, bits, loss_bits_by_step, run_in_process
from truestep.core.errors import ExitCode, expected_failure
from truestep.telemetry.jsonl import LINE_LIMIT, LogFileError, iter_jsonl

HOSTILE_LINES = [
    b"garbage{\n",
    b"[" * 100_000 + b"\n",
    b'{"event": "x", "bad": "\xff\xfe"}\n',
    b'{"pad": "' + b"x" * (LINE_LIMIT + 10) + b'"}\n',
    b'{"n": ' + b"9" * 5000 + b"}\n",
]
"""Garbage, nesting past the parser's recursion limit, invalid UTF-8, a line over LINE_LIMIT, an integer
of 5,000 digits: each one skipped, none raises."""


def _said(path: Path, **limits: int) -> tuple[list[dict], list[str]]:
    said: list[str] = []
    return list(iter_jsonl(path, say=said.append, **limits)), said


def test_bad_lines_are_skipped_counted_and_said_once(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(
        b'{"event": "a"}\n'
        + b"".join(HOSTILE_LINES)
        + b'{"loss": NaN, "event": "b"}\n'  # a NaN loss is logged as Python writes it
        + b"[1, 2]\n"  # not an object: not a record, not an error
        + b'{"event": "torn'  # the last line, cut by a kill or a full disk: skipped quietly
    )
    records, said = _said(log)
    assert [r["event"] for r in records] == ["a", "b"]
    assert len(said) == 1 and "\n" not in said[0], said
    assert f"skipped {len(HOSTILE_LINES)} unreadable line(s)" in said[0], said[0]
    for kind in (
        "1 JSONDecodeError",
        "1 RecursionError",
        "1 UnicodeDecodeError",
        "1 ValueError",
        "1 too long",
    ):
        assert kind in said[0], (kind, said[0])


def test_a_clean_log_says_nothing(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(5)))
    assert _said(log) == ([{"step": s} for s in range(5)], [])


def test_a_16_gib_log_is_read_from_its_tail_in_bounded_memory(tmp_path: Path) -> None:
    """A sparse 16 GiB file of NUL bytes (no line ends at all) with one record at its very end: only the
    last `tail_limit` bytes are read (the line the cut falls in is dropped, never held whole), and the
    record is found."""
    log = tmp_path / "metrics.jsonl"
    with open(log, "wb") as f:
        f.truncate(16 << 30)
        f.seek(0, os.SEEK_END)
        f.write(b'\n{"step": 7}\n')
    records, said = _said(log, tail_limit=16 << 20)
    assert records == [{"step": 7}]
    assert said[0].startswith(f"{log} is {(16 << 30) + 13} bytes: reading only its last {16 << 20}"), said
    assert len(said) == 1, said


def test_a_log_that_is_a_fifo_or_a_symlink_is_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo)  # a plain open would block forever: no writer
    with pytest.raises(LogFileError) as caught:
        list(iter_jsonl(fifo))
    assert expected_failure(caught.value) == (ExitCode.REFUSED, f"{fifo}: refusing to open a FIFO as a file: "
                                             "refusing to read it as a log")  # fmt: skip
    link = tmp_path / "metrics.jsonl"
    link.symlink_to("/dev/zero")
    with pytest.raises(LogFileError):
        list(iter_jsonl(link))
    assert list(iter_jsonl(tmp_path / "missing.jsonl")) == []


def test_a_rank_resumes_bit_for_bit_through_hostile_logs(
    inprocess_reference: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Stopped at step 4, then both logs get the hostile lines and a torn last line (the resume's
    readers: the restored step's witness and digest, the pre-fault metrics, the narrated recovery time):
    the resume runs to the end (exit 0, not 1) and its losses are the reference's, bit for bit -- step 5's
    line too: the writer ends the torn line before its first record instead of gluing onto it."""
    run = tmp_path / "run"
    assert run_in_process(run, *INPROCESS_JOB, "--train.stop_at_step=4") == 0
    for name in ("events.jsonl", "metrics.jsonl"):
        with open(run / name, "ab") as f:
            f.write(b"".join(HOSTILE_LINES) + b'{"event": "checkpoint_save", "step": 4, "torn')
    capfd.readouterr()
    assert run_in_process(run, *INPROCESS_JOB) == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err and "skipped" in err, err[-3000:]
    losses = {m["step"]: bits(m["loss"]) for m in iter_jsonl(run / "metrics.jsonl", say=lambda line: None)}
    assert losses == loss_bits_by_step(inprocess_reference)
    ends = [e for e in iter_jsonl(run / "events.jsonl", say=lambda line: None) if e.get("event") == "run_end"]
    assert ends[-1]["reason"] == "completed"
    shutil.rmtree(run)
