"""A job must never be stranded (issue 9): a fault before the first commit restarts from step 0; a rank
stopped while starting or restoring is detected; Ctrl-C saves and stops; a fresh start never writes over
another trajectory's committed checkpoints; an unwritable checkpoint directory is refused at start."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import harness
from harness import TINY, events, launch, truestep_env
from supervised import (
    HOLD_OVERRIDE,
    HOLD_STEP,
    LIVENESS,
    SLACK,
    assert_matches_reference,
    finish,
    hold,
    one_line,
    supervise,
    supervisor_events,
    wait_for_event,
    wait_until_held,
)
from truestep.checkpoint.catalog import MARKER, QUARANTINE, SUPERSEDED, step_dir_name, step_dirs, step_of
from truestep.checkpoint.resolver import NO_CHECKPOINT, NONE_VERIFIED, pick_resume
from truestep.config.schema import CheckpointConfig
from truestep.telemetry.run_logs import RunLogs

pytestmark = pytest.mark.multiprocess

STARTUP = 4.0


def test_a_crash_before_the_first_commit_restarts_from_step_zero(
    supervised_reference: Path, tmp_path: Path
) -> None:
    """The issue's reproduction: rank 1 dies inside the only save (step 5) before anything committed."""
    proc = supervise(tmp_path, restarts=1, faults="crash-in-save:phase=mid-shards:step=5:rank=1")
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    fresh = events(tmp_path, "fresh_start")
    assert len(fresh) == 1 and fresh[0]["quarantined_now"][0].startswith(step_dir_name(5))
    assert events(tmp_path, "checkpoint_restore") == []
    assert_matches_reference(tmp_path, supervised_reference)


def _dir(root: Path, name: str, committed: bool) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"shard")
    if committed:
        (path / MARKER).write_text(json.dumps({"step": 5, "manifest_sha256": "0" * 64}))
    return path


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ({"live": False}, NO_CHECKPOINT),  # torn first save
        ({"quarantined": False}, NO_CHECKPOINT),  # quarantined by an earlier start, never committed
        ({"live": True}, NONE_VERIFIED),  # committed, then corrupted
        ({"quarantined": True}, NONE_VERIFIED),  # committed work already quarantined: still refuse
        ({"live": False, "quarantined": True}, NONE_VERIFIED),
    ],
)
def test_fresh_start_is_decided_by_commit_markers_on_disk(
    tmp_path: Path, layout: dict, expected: int
) -> None:
    root = tmp_path / "checkpoints"
    if "live" in layout:
        _dir(root, step_dir_name(5), layout["live"])
    if "quarantined" in layout:
        _dir(root / QUARANTINE, f"{step_dir_name(3)}.1700000000000.torn", layout["quarantined"])
    logs = RunLogs(tmp_path, attempt=1, enabled=True)
    assert pick_resume(root, CheckpointConfig(), logs) == expected
    logs.close()
    assert step_dirs(root) == []  # a live directory that failed was quarantined, not deleted
    fresh = harness.events(tmp_path, "fresh_start") if (tmp_path / "events.jsonl").exists() else []
    assert len(fresh) == (1 if expected == NO_CHECKPOINT else 0)


def test_a_rank_stopped_while_starting_is_detected(supervised_reference: Path, tmp_path: Path) -> None:
    """SIGSTOP before the rank's first heartbeat (the `startup` fault point comes right before it): seen
    stopped from outside its interpreter (/proc), so declared after the liveness timeout, not after the
    start-up allowance (the default 20 s here: 19.2-19.7 s before; resilience.process_watch=false brings
    that back, tests/test_outside_watch.py)."""
    proc = supervise(tmp_path, "--resilience.startup_timeout_s=20", faults="hang:at=startup:rank=1")
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    fault = events(tmp_path, "fault_injected")[0]
    failure = supervisor_events(tmp_path, "failure_detected")[0]
    assert (failure["kind"], failure["rank"]) == ("process_stopped", 1)
    assert failure["detected_at"] - fault["time"] < LIVENESS + SLACK
    assert_matches_reference(tmp_path, supervised_reference)


def test_a_rank_stopped_from_outside_at_launch_is_detected(
    supervised_reference: Path, tmp_path: Path
) -> None:
    proc = supervise(tmp_path, f"--resilience.startup_timeout_s={STARTUP}")
    start = wait_for_event(tmp_path, "attempt_start")
    stopped = time.time()
    subprocess.run(["kill", "-STOP", str(start["pids"][1])], check=True)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    failure = supervisor_events(tmp_path, "failure_detected")[0]
    assert failure["rank"] == 1 and failure["kind"] in (
        "process_stopped",
        "startup_timeout",
        "stale_heartbeat",
    )
    assert failure["detected_at"] - stopped < STARTUP + SLACK
    assert_matches_reference(tmp_path, supervised_reference)


def test_a_rank_stopped_while_restoring_is_detected(supervised_reference: Path, tmp_path: Path) -> None:
    faults = "kill:rank=1:step=7;hang:at=restore:rank=1:restart=1"
    # Synchronous saves: step 5 is committed before step 6 starts, so attempt 1 has something to restore.
    proc = supervise(tmp_path, "--checkpoint.async_save=false", faults=faults)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    failures = supervisor_events(tmp_path, "failure_detected")
    # Stopped: its heartbeat goes stale, and /proc says stopped; whichever rule sees it first.
    assert [f["attempt"] for f in failures] == [0, 1] and failures[0]["kind"] == "process_exit"
    assert failures[1]["kind"] in ("stale_heartbeat", "process_stopped")
    hung = [e for e in events(tmp_path, "fault_injected") if e["kind"] == "hang"]
    assert [(e["point"], e["attempt"]) for e in hung] == [("restore", 1)]
    assert failures[1]["detected_at"] - hung[0]["time"] < 3.0 + SLACK  # liveness_timeout_s + slack
    assert_matches_reference(tmp_path, supervised_reference)


def test_ctrl_c_saves_and_stops_without_a_restart(supervised_reference: Path, tmp_path: Path) -> None:
    # Sent after a mere heartbeat, the Ctrl-C once arrived after step 30 (exit 0) and once during a later
    # pause that hang detection then ended (no graceful stop): it now lands while rank 0 is held.
    proc = supervise(tmp_path, HOLD_OVERRIDE, faults=hold())
    wait_until_held(tmp_path)
    proc.send_signal(signal.SIGINT)
    assert finish(proc) == 130, finish.last_output  # type: ignore[attr-defined]
    assert "Traceback" not in finish.last_output  # type: ignore[attr-defined]
    assert [e["signal"] for e in supervisor_events(tmp_path, "supervisor_signal")] == ["SIGINT"]
    stop = events(tmp_path, "signal_received")[-1]
    # The supervisor signals every rank; the ranks may agree on the stop before rank 0's own SIGINT
    # has been noted ("peer"): either way, the stop is an interrupt.
    assert (stop["signal"] in ("SIGINT", "peer"), stop["stop_reason"]) == (True, "interrupted"), stop
    assert stop["stop_step"] == HOLD_STEP, stop  # the first step boundary after the signal
    assert stop["stop_step"] in {e["step"] for e in events(tmp_path, "checkpoint_commit")}
    assert supervisor_events(tmp_path, "restart") == []
    assert finish(supervise(tmp_path)) == 0
    assert events(tmp_path, "checkpoint_restore")[-1]["step"] == stop["stop_step"]
    assert_matches_reference(tmp_path, supervised_reference)


def test_a_second_ctrl_c_stops_at_once(tmp_path: Path) -> None:
    env = truestep_env({"TRUESTEP_FAULTS": "sleep:at=train:step:step=4:seconds=60"})
    cmd = [sys.executable, "-m", "truestep", "train", "tiny", f"--run.dir={tmp_path}", *TINY]
    cmd.append("--allow-env-faults")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_event(tmp_path, "fault_injected")
    proc.send_signal(signal.SIGINT)  # graceful: would save at the end of the stalled step
    time.sleep(0.5)
    sent = time.time()
    proc.send_signal(signal.SIGINT)  # "stop now"
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.time() - sent < SLACK
    assert "Traceback" not in err and "second Ctrl-C" in err


RUN = ["--train.max_steps=6", "--checkpoint.interval=3"]


def test_a_fresh_start_does_not_write_over_committed_checkpoints(tmp_path: Path) -> None:
    launch(tmp_path, *RUN)
    before = (tmp_path / "metrics.jsonl").read_bytes()
    refused = launch(tmp_path, *RUN, "--checkpoint.resume=false", check=False)
    assert refused.returncode == 3
    assert "--checkpoint.overwrite=true" in one_line(refused.stderr)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    assert [step_of(p) for p in step_dirs(tmp_path / "checkpoints")] == [6, 3]
    launch(tmp_path, *RUN, "--checkpoint.resume=false", "--checkpoint.overwrite=true", "--train.seed=5")
    aside = sorted(p.name.split(".")[0] for p in (tmp_path / "checkpoints" / SUPERSEDED).iterdir())
    assert aside == [step_dir_name(3), step_dir_name(6)]
    assert len(events(tmp_path, "checkpoint_set_aside")) == 2
    # A later resume continues the new trajectory, never the old one.
    again = launch(tmp_path, "--train.max_steps=6", "--train.seed=5")
    assert events(tmp_path, "run_end")[-1]["step"] == 6 and again.returncode == 0


def test_an_unwritable_checkpoint_directory_is_refused_at_start(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    run = tmp_path / "run"
    proc = launch(run, *RUN, f"--checkpoint.dir={tmp_path / 'a-file' / 'ckpt'}", check=False)
    assert proc.returncode == 3
    assert "is not writable" in one_line(proc.stderr)
    assert not (run / "metrics.jsonl").exists() or (run / "metrics.jsonl").read_text() == ""
