"""Fencing within one lease namespace (issue 27, item 1): markers record the run directory's identity
with the incarnation, so checkpoints copied from another run directory are resumed with one clear line,
never block this run's saves, and are never deleted by this run's retention."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import INPROCESS_JOB, events, run_in_process
from truestep.checkpoint.catalog import MARKER, committed_dirs
from truestep.checkpoint.manifest import write_marker
from truestep.checkpoint.ownership import foreign_run, newer_own_commit, own_committed
from truestep.core.names import LEASE_FILE
from truestep.resilience.lease import RunDirLease, read_lease

JOB = (*INPROCESS_JOB, "--checkpoint.interval=2")


def _markers(root: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / MARKER).read_text()) for d in committed_dirs(root)}


def test_the_lease_carries_one_run_id_across_jobs(tmp_path: Path) -> None:
    first = RunDirLease(tmp_path, "job-a", ttl_s=30.0)
    first.acquire()
    run_id = read_lease(tmp_path).run_id
    first.release()
    RunDirLease(tmp_path, "job-b", ttl_s=30.0).acquire()
    assert len(run_id) == 32 and read_lease(tmp_path).run_id == run_id
    other = tmp_path / "other"
    other.mkdir()
    RunDirLease(other, "job-a", ttl_s=30.0).acquire()
    assert read_lease(other).run_id not in ("", run_id)


def test_copied_checkpoints_resume_and_never_block_or_lose_to_this_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for stop in (2, 4, 6):  # three attempts: A's markers carry incarnations up to 2
        assert run_in_process(a, *JOB, f"--train.stop_at_step={stop}", "--checkpoint.keep_last_n=0") == 0
    copied = _markers(a / "checkpoints")
    assert max(m["incarnation"] for m in copied.values()) == 2
    assert {m["version"] for m in copied.values()} == {2}
    b.mkdir()
    shutil.copytree(a / "checkpoints", b / "checkpoints")
    capsys.readouterr()
    # B's first attempt (incarnation 0) saves at once; keep_last_n=1 would delete A's copies if counted.
    assert run_in_process(b, *JOB, "--checkpoint.keep_last_n=1") == 0
    assert "resuming from checkpoints copied from another run directory" in capsys.readouterr().err
    (origin,) = events(b, "checkpoint_from_other_run")
    a_id, b_id = read_lease(a).run_id, read_lease(b).run_id
    assert origin["origin_run_id"] == a_id != b_id
    markers = _markers(b / "checkpoints")
    assert {name for name, m in markers.items() if m["run_id"] == a_id} == set(copied)  # all still there
    own = [m for m in markers.values() if m["run_id"] == b_id]
    assert len(own) == 1 and own[0]["incarnation"] == 0  # retention kept B's newest only


def _commit(root: Path, step: int, incarnation: int, run_id: str | None) -> Path:
    ckpt = root / f"step_{step:08d}"
    ckpt.mkdir(parents=True)
    writer = {"incarnation": incarnation} if run_id is None else {"version": 2, "run_id": run_id}
    write_marker(ckpt, step, b"{}", incarnation, writer)
    return ckpt


def test_incarnations_are_compared_within_one_run_only(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _commit(root, 6, incarnation=2, run_id="other")
    _commit(root, 4, incarnation=0, run_id="mine")
    assert newer_own_commit(root, "mine", incarnation=0) is None
    _commit(root, 8, incarnation=1, run_id="mine")  # a newer attempt of this run committed: stale writer
    assert newer_own_commit(root, "mine", incarnation=0) == (root / "step_00000008", 1)


def test_retention_only_counts_this_runs_own_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _commit(root, 2, 0, "other")
    _commit(root, 3, 0, None)  # a version 1 marker: whose is unknown, so not ours to delete
    ours = [_commit(root, 4, 0, "mine"), _commit(root, 6, 1, "mine")]
    assert own_committed(root, "mine") == ours[::-1]
    assert foreign_run(root / "step_00000002", "mine") == "other"
    assert foreign_run(root / "step_00000003", "mine") is None
    assert foreign_run(ours[0], "mine") is None


def test_a_lease_from_an_older_truestep_gains_a_run_id(tmp_path: Path) -> None:
    old = {"format": "truestep-lease", "job": "j", "host": "h", "boot_id": "", "pid": 1}
    old |= {"pid_start": None, "incarnation": 4, "acquired_at": 1.0, "renewed_at": 1.0, "released": True}
    (tmp_path / LEASE_FILE).write_text(json.dumps(old))
    assert read_lease(tmp_path).run_id == ""
    RunDirLease(tmp_path, "j2", ttl_s=30.0).acquire()
    holder = read_lease(tmp_path)
    assert holder.run_id and holder.incarnation == 4
