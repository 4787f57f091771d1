"""`truestep ckpt list|verify|inspect` (truestep.cli.ckpt.ckpt_main) on a real run directory."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

import harness
from ckpt_cases import COMMITTED_FILES
from truestep.checkpoint.catalog import MANIFEST, MARKER, QUARANTINE, step_dir_name
from truestep.checkpoint.inspect import inspect_checkpoint, list_checkpoints
from truestep.checkpoint.manifest import write_manifest, write_marker
from truestep.checkpoint.resolver import quarantine_logged as quarantine
from truestep.cli.ckpt import ckpt_main
from truestep.telemetry.run_logs import RunLogs

pytestmark = pytest.mark.multiprocess

SHARD = "__0_0.distcp"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """Checkpoints at steps 3 and 6 (the final save at 6 coincides with the interval save)."""
    run = tmp_path_factory.mktemp("cli") / "run"
    harness.launch(run, "--train.max_steps=6", "--checkpoint.interval=3")
    return run


@pytest.fixture
def run_copy(run, tmp_path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / step_dir_name(step)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = ckpt_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


class Evil:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch '{self.path}'",))


# ----------------------------------------------------------------------------------------------
# list


def test_list_json_on_run_dir_and_root_agree(run, capsys):
    rc, out, err = cli(capsys, "list", run, "--json")
    assert rc == 0 and err == ""
    listing = json.loads(out)
    assert listing["root"] == str(run / "checkpoints")
    entries = listing["checkpoints"]
    assert [(e["step"], e["status"], e["committed"], e["verified"]) for e in entries] == [
        (6, "ok", True, True),
        (3, "ok", True, True),
    ]
    for e in entries:
        assert e["size_bytes"] == disk_bytes(ckpt(run, e["step"]))
        assert e["files"] == len(COMMITTED_FILES) and e["reason"] is None and not e["quarantined"]
    assert [e["latest_hint"] for e in entries] == [True, False]

    rc, out_root, _ = cli(capsys, "list", run / "checkpoints", "--json")
    assert rc == 0 and json.loads(out_root)["checkpoints"] == entries


def test_list_text_shows_invalid_and_quarantined(run_copy, capsys):
    (ckpt(run_copy, 6) / MARKER).unlink()
    logs = RunLogs(run_copy, attempt=9, enabled=True)
    moved = quarantine(ckpt(run_copy, 3), "test: planted reason", logs)
    logs.close()
    rc, out, err = cli(capsys, "list", run_copy)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    (row6,) = [line for line in lines if line.strip().startswith("6 ") and "step_00000006" in line]
    assert "invalid" in row6 and "missing COMMITTED" in row6
    assert "quarantined (1" in out
    (qrow,) = [line for line in lines if moved.name in line]
    assert "test: planted reason" in qrow  # the reason comes from events.jsonl
    assert "0 of 1 live checkpoint(s) verify" in out

    entries = list_checkpoints(run_copy)
    assert [(e["step"], e["status"], e["quarantined"]) for e in entries] == [
        (6, "invalid", False),
        (3, "quarantined", True),
    ]


def test_list_errors(tmp_path, capsys):
    rc, out, err = cli(capsys, "list", tmp_path / "nope")
    assert rc == 2 and out == "" and "no such directory" in err
    rc, out, _ = cli(capsys, "list", tmp_path)
    assert rc == 0 and "no checkpoints under" in out
    rc, _, err = cli(capsys)
    assert rc == 2 and "usage: truestep ckpt" in err


# ----------------------------------------------------------------------------------------------
# verify


def test_verify_ok(run, capsys):
    rc, out, err = cli(capsys, "verify", ckpt(run, 6))
    assert rc == 0 and err == ""
    assert out.startswith(
        f"OK {ckpt(run, 6)}: step 6, {len(COMMITTED_FILES)} files, {disk_bytes(ckpt(run, 6))} bytes"
    )
    rc, out, _ = cli(capsys, "verify", ckpt(run, 3), "--no-checksums")
    assert rc == 0 and "checksums not checked" in out


def test_verify_flipped_byte(run_copy, capsys):
    flip_byte(ckpt(run_copy, 6) / SHARD)
    rc, out, err = cli(capsys, "verify", ckpt(run_copy, 6))
    assert rc == 1 and out == ""
    assert "FAILED: __0_0.distcp: SHA-256 mismatch (corrupted)" in err
    # Size-only verification cannot see a same-size flip (the documented trade-off).
    rc, _, _ = cli(capsys, "verify", ckpt(run_copy, 6), "--no-checksums")
    assert rc == 0


def test_verify_truncated_and_missing(run_copy, capsys):
    shard = ckpt(run_copy, 6) / SHARD
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:100])
    rc, _, err = cli(capsys, "verify", ckpt(run_copy, 6), "--no-checksums")
    assert rc == 1 and f"__0_0.distcp: size 100 != manifest {size} (truncated?)" in err
    (ckpt(run_copy, 3) / ".metadata").unlink()
    rc, _, err = cli(capsys, "verify", ckpt(run_copy, 3))
    assert rc == 1 and "missing file .metadata" in err


def test_verify_usage_errors(run, tmp_path, capsys):
    rc, _, err = cli(capsys, "verify", tmp_path / "nope")
    assert rc == 2 and "no such directory" in err
    rc, _, err = cli(capsys, "verify", run)
    assert rc == 2 and "not a checkpoint directory" in err and f"truestep ckpt list {run}" in err


# ----------------------------------------------------------------------------------------------
# inspect


def test_inspect_json(run, capsys):
    rc, out, err = cli(capsys, "inspect", ckpt(run, 6), "--json")
    assert rc == 0 and err == ""
    info = json.loads(out)
    (start,) = harness.events(run, "run_start")
    assert info["step"] == 6 and info["verified"] is True and info["reason"] is None
    assert info["layout"] == {"world_size": 1, "dp": 1, "tp": 1, "backend": "none"}
    assert info["world_size"] == 1 and info["rank_files"] == ["rank00000.json"]
    assert info["config_fingerprint"] == start["config_fingerprint"]
    assert info["config_keys"]["train.max_steps"] == 6
    assert info["train_state"]["step"] == 6
    assert info["train_state"]["tokens_seen"] == 6 * 8 * 32
    assert info["data_position"]["next_batch"] == 6
    assert info["files"] == len(COMMITTED_FILES) and info["total_bytes"] == disk_bytes(ckpt(run, 6))
    assert info["manifest_files"] == len(set(COMMITTED_FILES) - {MANIFEST, MARKER})  # it lists the rest
    assert info["marker"]["step"] == 6
    assert info["problems"] == []


def test_inspect_text(run, capsys):
    rc, out, err = cli(capsys, "inspect", ckpt(run, 3))
    assert rc == 0 and err == ""
    rows = dict(line.split(None, 1) for line in out.splitlines() if " " in line and not line.startswith(" "))
    assert rows["step"].strip() == "3"
    assert rows["status"].startswith("verified")
    assert "world_size=1" in rows["layout"]
    assert "step=3" in out and "next_batch=3" in out


def test_inspect_unverified_reports_reason(run_copy, capsys):
    flip_byte(ckpt(run_copy, 6) / SHARD)
    rc, out, _ = cli(capsys, "inspect", ckpt(run_copy, 6), "--json")
    info = json.loads(out)
    assert rc == 0 and info["verified"] is False
    assert info["reason"].startswith("__0_0.distcp: SHA-256 mismatch (corrupted) in bytes ")
    assert info["train_state"]["step"] == 6  # still readable: only JSON is read
    rc, out, _ = cli(capsys, "inspect", ckpt(run_copy, 6))
    assert "NOT VERIFIED: __0_0.distcp: SHA-256 mismatch" in out


def test_inspect_never_unpickles(run_copy, tmp_path, capsys):
    """Pickles planted as .metadata and as rank00000.json (manifest and marker rewritten to match):
    inspect reads JSON (and .metadata only through the allow-list unpickler), reports the non-JSON rank
    state, refuses to call it verified, and runs nothing."""
    d = ckpt(run_copy, 6)
    marker = tmp_path / "pwned"
    (d / ".metadata").write_bytes(pickle.dumps(Evil(marker)))
    (d / "rank00000.json").write_bytes(pickle.dumps(Evil(marker)))
    write_marker(d, 6, write_manifest(d, 6))
    info = inspect_checkpoint(d)
    assert info["verified"] is False and "references posix.system; refused" in info["reason"]
    assert any("rank00000.json is not valid JSON" in p for p in info["problems"])
    assert info["train_state"] is None and info["layout"] is None
    rc, out, _ = cli(capsys, "inspect", d)
    assert rc == 0 and "problem" in out and "not valid JSON" in out
    rc, _, _ = cli(capsys, "list", run_copy, "--json")
    assert rc == 0
    assert not marker.exists()


def test_inspect_quarantined_dir(run_copy, capsys):
    logs = RunLogs(run_copy, attempt=9, enabled=True)
    moved = quarantine(ckpt(run_copy, 6), "missing COMMITTED", logs)
    logs.close()
    assert moved.parent.name == QUARANTINE
    rc, out, _ = cli(capsys, "inspect", moved, "--json")
    info = json.loads(out)
    assert rc == 0 and info["step"] == 6 and info["quarantined"] is True and info["verified"] is False
    rc, _, err = cli(capsys, "verify", moved)
    assert rc == 1 and "(quarantined)" in err
