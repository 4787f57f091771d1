"""The run directory's control files (lease, heartbeats, attempt configs, events at resume) are read
through the bounded, no-follow reader: a FIFO, a symlink, a huge or a malformed file is a one-line
refusal or is ignored, never a hang, a crash or a traceback (issue 27, item 4)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from truestep.config.errors import ConfigError
from truestep.config.load import load_config
from truestep.core.errors import RunDirBusyError
from truestep.core.names import EVENTS_FILE, LEASE_FILE, heartbeat_path
from truestep.resilience.heartbeat import read_heartbeat
from truestep.resilience.lease import RunDirLease, _last_attempt_in_events, read_lease

HANG_BOUND_S = 60.0
"""Not a speed target: a read that blocks on a FIFO never returns, this only turns that into a failure."""


def _lease_record(**changes: Any) -> dict[str, Any]:
    record = {
        "format": "truestep-lease",
        "job": "j1",
        "host": "elsewhere",
        "boot_id": "",
        "pid": 1234,
        "pid_start": None,
        "incarnation": 2,
        "acquired_at": 1.0,
        "renewed_at": 1.0,
    }
    return {**record, **changes}


def _returns_despite_fifo(fifo: Path, call: Callable[[], Any]) -> Any:
    """Run `call` (which reads `fifo`) on a thread; fail if it blocks. A blocked reader is released by
    opening and closing the FIFO's write end (EOF), so no thread outlives the test."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as err:  # handed to the test thread, re-raised there
            result["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_BOUND_S)
    blocked = thread.is_alive()
    if blocked:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(HANG_BOUND_S)
    assert not blocked, f"reading {fifo.name} blocked on a FIFO"
    if "error" in result:
        raise result["error"]
    return result.get("value")


def test_fifo_lease_is_refused_in_one_line_not_a_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / LEASE_FILE)
    with pytest.raises(RunDirBusyError, match="FIFO") as err:
        _returns_despite_fifo(tmp_path / LEASE_FILE, lambda: read_lease(tmp_path))
    assert "\n" not in str(err.value)


def test_symlinked_lease_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "other-run-lease.json"
    elsewhere.write_text(json.dumps(_lease_record()))
    run = tmp_path / "run"
    run.mkdir()
    (run / LEASE_FILE).symlink_to(elsewhere)
    with pytest.raises(RunDirBusyError, match="symlink"):
        read_lease(run)


def test_oversized_lease_is_refused_unread(tmp_path: Path) -> None:
    padded = json.dumps(_lease_record()) + " " * (1 << 20)  # valid JSON, but no lease is a MiB
    (tmp_path / LEASE_FILE).write_text(padded)
    with pytest.raises(RunDirBusyError, match="bytes"):
        read_lease(tmp_path)


@pytest.mark.parametrize(
    "changes",
    [{"pid": "1234"}, {"incarnation": "2"}, {"incarnation": True}, {"renewed_at": None}, {"job": 7}],
)
def test_mistyped_lease_field_is_refused_naming_it(tmp_path: Path, changes: dict[str, Any]) -> None:
    (tmp_path / LEASE_FILE).write_text(json.dumps(_lease_record(**changes)))
    key = next(iter(changes))
    with pytest.raises(RunDirBusyError, match=f"'{key}'"):
        read_lease(tmp_path)


def test_acquire_refuses_a_planted_lease_and_keeps_it(tmp_path: Path) -> None:
    (tmp_path / LEASE_FILE).write_text(json.dumps(_lease_record(pid="x")))
    with pytest.raises(RunDirBusyError):
        RunDirLease(tmp_path, "j2", ttl_s=30.0).acquire()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["pid"] == "x"


def _beat(**changes: Any) -> dict[str, Any]:
    return {"pid": 5, "rank": 0, "attempt": 0, "time": 1.0, "step": 3, "phase": "train", **changes}


def test_heartbeat_reads_a_good_beat(tmp_path: Path) -> None:
    path = heartbeat_path(tmp_path, 0)
    path.parent.mkdir()
    path.write_text(json.dumps(_beat()))
    assert read_heartbeat(path) == _beat()


@pytest.mark.parametrize(
    "beat",
    [
        {k: v for k, v in _beat().items() if k != "phase"},
        _beat(step="3"),
        _beat(time=float("inf")),
        _beat(pid=None),
        ["not", "an", "object"],
    ],
)
def test_malformed_heartbeat_is_ignored(tmp_path: Path, beat: object) -> None:
    path = heartbeat_path(tmp_path, 0)
    path.parent.mkdir()
    path.write_text(json.dumps(beat))
    assert read_heartbeat(path) is None


def test_fifo_or_symlinked_heartbeat_is_ignored(tmp_path: Path) -> None:
    path = heartbeat_path(tmp_path, 0)
    path.parent.mkdir()
    os.mkfifo(path)
    assert _returns_despite_fifo(path, lambda: read_heartbeat(path)) is None
    path.unlink()
    target = tmp_path / "beat.json"
    target.write_text(json.dumps(_beat()))
    path.symlink_to(target)
    assert read_heartbeat(path) is None


def test_events_at_resume_are_read_bounded_and_without_following(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.jsonl"
    target.write_text(json.dumps({"event": "attempt_start", "attempt": 9}) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / EVENTS_FILE).symlink_to(target)
    assert _last_attempt_in_events(run) == -1
    (run / EVENTS_FILE).unlink()
    os.mkfifo(run / EVENTS_FILE)
    assert _returns_despite_fifo(run / EVENTS_FILE, lambda: _last_attempt_in_events(run)) == -1


def test_huge_events_log_is_read_from_its_tail_only(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    with open(path, "wb") as f:
        f.write(json.dumps({"attempt": 99}).encode() + b"\n")  # far from the end: never read
        f.truncate(64 << 20)  # 64 MiB of NULs without a newline (sparse), then the newest record
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + json.dumps({"attempt": 4}).encode() + b"\n" + b'{"attempt": "5"}\n')
    assert _last_attempt_in_events(tmp_path) == 4


def test_attempt_config_fifo_is_a_one_line_refusal(tmp_path: Path) -> None:
    path = tmp_path / "attempt00000-node0.toml"
    os.mkfifo(path)
    with pytest.raises(ConfigError, match="FIFO"):
        _returns_despite_fifo(path, lambda: load_config(str(path)))
