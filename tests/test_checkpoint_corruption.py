"""Commit protocol against on-disk corruption of the newest checkpoint and planted pickles.
Shared runs: tests/conftest.py, helpers: tests/ckpt_cases.py.
"""

from __future__ import annotations

import json
import pickle
import shutil

import pytest

from ckpt_cases import (
    CORRUPTIONS,
    DCP_METADATA,
    MANIFEST,
    MARKER,
    RANK0,
    SHARD,
    CorruptionCase,
    Evil,
    EvilExec,
    PickleCase,
    _flip_byte,
    assert_same_trajectory,
    attempt_events,
    ckpt,
    file_hashes,
    last_attempt,
    quarantined,
    step_dir_name,
)
from truestep.checkpoint.integrity import verify
from truestep.checkpoint.manifest import VerifyError, write_marker
from truestep.checkpoint.safe_dcp import UnsafeCheckpointError, safe_load_metadata

pytestmark = pytest.mark.multiprocess

# ----------------------------------------------------------------------------------------------
# corruption of the newest committed checkpoint


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupted_newest_checkpoint_is_quarantined_and_resume_falls_back(kind, derived_runs, reference):
    case: CorruptionCase = derived_runs[f"corrupt/{kind}"].result()
    run = case.run
    assert case.proc.returncode == 0, case.proc.stderr[-3000:]
    attempt = last_attempt(run)
    assert attempt == 1
    events = attempt_events(run, "checkpoint_quarantined", attempt)
    assert len(events) == 1, events
    assert events[0]["step"] == 6
    if kind in ("bad-marker-json", "flipped-byte"):
        assert events[0]["reason"].startswith(case.reason), events[0]["reason"]
    else:
        assert events[0]["reason"] == case.reason
    # Moved, never deleted nor repaired: the quarantined copy still holds the corruption.
    (moved,) = quarantined(run)
    assert moved.name.startswith("step_00000006.") and events[0]["moved_to"] == str(moved)
    assert file_hashes(moved) == case.corrupted
    # A flipped shard byte passes the structural checks and is caught by the load itself.
    verified = [6, 3] if kind == "flipped-byte" else [3]
    assert [e["step"] for e in attempt_events(run, "checkpoint_verified", attempt)] == verified
    assert [e["step"] for e in attempt_events(run, "checkpoint_restore", attempt)] == [3]
    # The resumed run re-saved step 6 (a fresh, complete directory) and continued bitwise.
    verify(ckpt(run, 6), checksums=True)
    assert_same_trajectory(run, reference, attempt=attempt, first_step=4)


def test_flipped_byte_needs_checksums(reference, tmp_path):
    """The documented trade-off of --checkpoint.verify_checksums=false: sizes are always checked but a
    same-size bit flip is only caught by the SHA-256 pass. (No training on it: that would restore
    silently corrupted weights, which is exactly what the switch accepts.)"""
    d = tmp_path / step_dir_name(6)
    shutil.copytree(ckpt(reference, 6), d)
    size = (d / SHARD).stat().st_size
    _flip_byte(d)
    assert (d / SHARD).stat().st_size == size
    manifest = verify(d, checksums=False)
    assert manifest["files"][SHARD]["size"] == size
    with pytest.raises(VerifyError, match=r"__0_0\.distcp: SHA-256 mismatch"):
        verify(d, checksums=True)


def test_consistently_rewritten_manifest_still_catches_size(reference, tmp_path):
    """An edited size with the marker rewritten to match the edited manifest: the size check fires."""
    d = tmp_path / step_dir_name(6)
    shutil.copytree(ckpt(reference, 6), d)
    manifest = json.loads((d / MANIFEST).read_text())
    real = manifest["files"][SHARD]["size"]
    manifest["files"][SHARD]["size"] = real - 1
    blob = json.dumps(manifest).encode()
    (d / MANIFEST).write_bytes(blob)
    write_marker(d, 6, blob)
    with pytest.raises(VerifyError, match=rf"__0_0\.distcp: size {real} != manifest {real - 1}"):
        verify(d, checksums=False)


def test_planted_file_named_like_the_marker_in_a_subdirectory(reference, tmp_path):
    d = tmp_path / step_dir_name(6)
    shutil.copytree(ckpt(reference, 6), d)
    (d / "sub").mkdir()
    (d / "sub" / MARKER).write_text("{}")
    with pytest.raises(VerifyError, match="files not in the manifest: sub/COMMITTED"):
        verify(d, checksums=True)


def test_malformed_manifest_entry_is_a_verify_error(reference, tmp_path):
    d = tmp_path / step_dir_name(6)
    shutil.copytree(ckpt(reference, 6), d)
    manifest = json.loads((d / MANIFEST).read_text())
    manifest["files"][SHARD] = 12345
    blob = json.dumps(manifest).encode()
    (d / MANIFEST).write_bytes(blob)
    write_marker(d, 6, blob)
    with pytest.raises(VerifyError):
        verify(d, checksums=True)


# ----------------------------------------------------------------------------------------------
# planted pickles


def test_legit_dcp_metadata_loads_safely(reference):
    metadata = safe_load_metadata((ckpt(reference, 6) / DCP_METADATA).read_bytes())
    keys = set(metadata.state_dict_metadata)
    assert "model.tok_embeddings.weight" in keys
    assert any(k.startswith("optim.") for k in keys)
    assert {info.relative_path for info in metadata.storage_data.values()} == {SHARD}


@pytest.mark.parametrize("variant", ["os.system", "builtins.exec", "nested-in-metadata"])
def test_safe_load_metadata_refuses_code(variant, reference, tmp_path):
    marker = tmp_path / "pwned"
    payload_obj = EvilExec(marker) if variant == "builtins.exec" else Evil(marker)
    if variant == "nested-in-metadata":
        # A genuine Metadata object carrying the payload in one of its fields.
        metadata = safe_load_metadata((ckpt(reference, 6) / DCP_METADATA).read_bytes())
        metadata.planner_data = {"x": payload_obj}
        payload = pickle.dumps(metadata)
    else:
        payload = pickle.dumps(payload_obj)
    # The payload is live: a plain unpickle runs it (which is what stock DCP would do).
    pickle.loads(payload)
    assert marker.exists()
    marker.unlink()

    expected = "builtins.exec" if variant == "builtins.exec" else "posix.system"
    with pytest.raises(UnsafeCheckpointError, match=rf"references {expected}; refused"):
        safe_load_metadata(payload)
    assert not marker.exists()


@pytest.mark.parametrize(
    "target,why",
    [
        (DCP_METADATA, "checkpoint metadata references posix.system; refused"),
        (RANK0, "rank00000.json is not valid JSON"),
    ],
)
def test_a_planted_pickle_fails_verification_and_resume_falls_back(target, why, derived_runs, reference):
    """A pickle planted as .metadata or rank00000.json, manifest and marker rewritten to match: the
    files are consistent, but the checkpoint does not verify (its metadata must load through the
    allow-list unpickler, its rank state must be JSON). So it is quarantined like any other bad
    checkpoint, the run resumes from step 3 bitwise, and the payload never runs."""
    case: PickleCase = derived_runs[f"pickle/{target}"].result()
    assert not case.verified_before
    assert case.proc.returncode == 0, case.proc.stderr[-3000:]
    assert not case.marker.exists()
    attempt = last_attempt(case.run)
    (event,) = attempt_events(case.run, "checkpoint_quarantined", attempt)
    assert event["step"] == 6 and why in event["reason"], event
    assert_same_trajectory(case.run, reference, attempt=attempt, first_step=4)
