"""Hostile checkpoints (issue 12, classes 2-5): storage paths confined, declared sizes bounded by the
bytes present, every parse failure a verification failure, and the cross-checks between the files.

No training here: every case is crafted around a copy of the shared reference run's step-6 checkpoint
(tests/conftest.py) and *recommitted* (manifest and marker rewritten to match, as anyone who can write
the directory can), so it is the check beyond the manifest's hashes that must catch it. Each case is
judged the way every consumer judges it: `verification_problem` (resume, export, init_from, generate),
`pick_resume` (quarantine and fall back to step 3), and `truestep ckpt verify|inspect|list` (one line,
never a crash, never a hang).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from hostile_cases import (
    METADATA,
    RANK0,
    SHARD,
    crafted_root,
    edit_metadata,
    judged_everywhere,
    listing,
    mkfifo,
    recommit,
    run_cli,
    six,
    tensor_entry,
)
from truestep.checkpoint.catalog import MANIFEST, MARKER, QUARANTINE, step_dir_name, step_dirs
from truestep.checkpoint.resolver import pick_resume
from truestep.checkpoint.weights import WeightsError, load_model_tensors
from truestep.cli.ckpt import ckpt_main
from truestep.config.schema import CheckpointConfig
from truestep.telemetry.run_logs import RunLogs

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def root(reference: Path, tmp_path: Path) -> Path:
    return crafted_root(reference, tmp_path)


# ---------------------------------------------------------------------------------------------- class 2


def _point_storage_at(target: str):
    def edit(metadata):
        for info in metadata.storage_data.values():
            info.relative_path = target

    return edit


@pytest.mark.parametrize(
    "target",
    ["../step_00000003/" + SHARD, "/etc/passwd", "ABSOLUTE", "./" + SHARD, "", "..", "sub/" + SHARD],
)
def test_storage_path_outside_the_checkpoint_is_refused(root, target):
    """The issue's case first: `.metadata` pointing at the previous step's shard verified and resumed
    another step's weights. Now no storage path but a plain file name inside the directory is read."""
    if target == "ABSOLUTE":
        target = str(root / step_dir_name(3) / SHARD)  # a real shard, absolutely named
    edit_metadata(six(root), _point_storage_at(target))
    judged_everywhere(root, "is not a plain file name inside the checkpoint")


def test_storage_path_naming_a_symlink_is_refused(root):
    d = six(root)
    os.symlink(root / step_dir_name(3) / SHARD, d / "link.distcp")
    edit_metadata_no_recommit(d, _point_storage_at("link.distcp"))
    recommit(d, files={**listing(d), "link.distcp": {"size": 1, "sha256": "0" * 64}})
    judged_everywhere(root, "link.distcp is a symlink, not a regular file")


def test_storage_path_naming_a_fifo_hangs_nothing(root):
    """A FIFO named by the metadata blocked every loader forever, and verification only looked at
    regular files: now it is refused (by lstat) before anything opens it."""
    d = six(root)
    mkfifo(d / "shard.distcp")
    edit_metadata_no_recommit(d, _point_storage_at("shard.distcp"))
    recommit(d, files={**listing(d), "shard.distcp": {"size": 0, "sha256": "0" * 64}})
    judged_everywhere(root, "shard.distcp is a FIFO, not a regular file")


@pytest.mark.parametrize("name", [METADATA, RANK0, MANIFEST, MARKER])
def test_a_fifo_in_place_of_any_checkpoint_file_hangs_nothing(root, name):
    d = six(root)
    (d / name).unlink()
    mkfifo(d / name)
    judged_everywhere(root, "FIFO")


def test_storage_file_not_in_the_manifest_is_refused(root):
    """A file the manifest does not list is never part of a checkpoint, whatever the metadata says."""
    d = six(root)
    shutil.copy(d / SHARD, d / "extra.distcp")
    edit_metadata_no_recommit(d, _point_storage_at("extra.distcp"))
    recommit(d, files=listing(d, skip=("extra.distcp",)))
    judged_everywhere(root, "files not in the manifest: extra.distcp")


def edit_metadata_no_recommit(d: Path, edit) -> None:
    import pickle

    from truestep.checkpoint.safe_dcp import safe_load_metadata

    metadata = safe_load_metadata((d / METADATA).read_bytes())
    edit(metadata)
    (d / METADATA).write_bytes(pickle.dumps(metadata))


# ---------------------------------------------------------------------------------------------- class 3


def _huge_declared(metadata):
    """Declare the embedding (and its one chunk) 10^6 times larger: 2 TB for the allocator to try."""
    item = tensor_entry(metadata)
    item.size = torch.Size([512 * 10**6, 64])
    item.chunks[0].sizes = torch.Size([512 * 10**6, 64])


def _chunk_beyond_size(metadata):
    tensor_entry(metadata).chunks[0].sizes = torch.Size([1024, 64])


def _chunks_do_not_cover(metadata):
    tensor_entry(metadata).size = torch.Size([1024, 64])


def _range_beyond_file(metadata):
    info = next(iter(metadata.storage_data.values()))
    info.offset = 10**12


def _negative_length(metadata):
    next(iter(metadata.storage_data.values())).length = -5


def _transforms(metadata):
    next(iter(metadata.storage_data.values())).transform_descriptors = ["zstd"]


SIZE_CASES = {
    "huge-declared-tensor": (_huge_declared, "declares 131072000000 bytes of float32 but stores"),
    "chunk-beyond-size": (_chunk_beyond_size, "exceeds [512, 64]"),
    "chunks-do-not-cover": (_chunks_do_not_cover, "chunks hold 32768 elements, the declared size [1024, 64]"),
    "range-beyond-file": (_range_beyond_file, "beyond the end of __0_0.distcp"),
    "negative-length": (_negative_length, "is not two integers >= 0"),
    "storage-transforms": (_transforms, "storage transforms ['zstd'] refused"),
}


@pytest.mark.parametrize("case", list(SIZE_CASES))
def test_declared_sizes_are_bounded_by_the_bytes_present(root, case):
    edit, why = SIZE_CASES[case]
    edit_metadata(six(root), edit)
    judged_everywhere(root, why)


def test_a_huge_declared_tensor_fails_with_a_message_not_an_allocation(root):
    """Even read without verification (weights.load_model_tensors: export, generate), the declared size
    is compared with the stored bytes before anything is allocated: fast, and a message."""
    edit_metadata(six(root), _huge_declared)
    started = time.perf_counter()
    with pytest.raises(WeightsError, match="declares 131072000000 bytes of float32 but stores"):
        load_model_tensors(six(root))
    assert time.perf_counter() - started < 10


# ---------------------------------------------------------------------------------------------- class 4


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _marker_nested(d: Path) -> None:
    (d / MARKER).write_text('{"step": 6, "x": ' + _nested(100_000) + "}")


def _manifest_nested(d: Path) -> None:
    blob = ('{"files": ' + _nested(100_000) + "}").encode()
    (d / MANIFEST).write_bytes(blob)
    from truestep.checkpoint.manifest import write_marker

    write_marker(d, 6, blob)


def _marker_huge_int(d: Path) -> None:
    (d / MARKER).write_text('{"step": ' + "9" * 5000 + "}")


def _rank_huge_int(d: Path) -> None:
    text = (d / RANK0).read_text()
    (d / RANK0).write_text(text.replace('"step":6', '"step":' + "9" * 5000, 1))
    recommit(d)


def _rank_not_json(d: Path) -> None:
    (d / RANK0).write_bytes(b"\x80\x04K\x01.")
    recommit(d)


def _empty_metadata(d: Path) -> None:
    from torch.distributed.checkpoint.metadata import Metadata

    edit_metadata(d, lambda _: Metadata(state_dict_metadata={}))


def _metadata_storage_list(d: Path) -> None:
    def edit(metadata):
        metadata.storage_data = list(metadata.storage_data.values())

    edit_metadata(d, edit)


def _metadata_size_strings(d: Path) -> None:
    def edit(metadata):
        tensor_entry(metadata).chunks = "no chunks"

    edit_metadata(d, edit)


def _metadata_not_pickle(d: Path) -> None:
    (d / METADATA).write_bytes(b"not a pickle at all")
    recommit(d)


def _metadata_missing(d: Path) -> None:
    (d / METADATA).unlink()
    recommit(d)


def _manifest_entry_outside(d: Path) -> None:
    recommit(d, files={**listing(d), "../step_00000003/" + SHARD: {"size": 1, "sha256": "0" * 64}})


def _manifest_digest_list(d: Path) -> None:
    files = listing(d)
    files[SHARD]["sha256"] = ["not", "a", "digest"]
    recommit(d, files=files)


PARSE_CASES = {
    "marker-nested-json": (_marker_nested, "COMMITTED is not valid JSON: RecursionError"),
    "manifest-nested-json": (_manifest_nested, "manifest.json is not valid JSON: RecursionError"),
    "marker-5000-digit-step": (_marker_huge_int, "COMMITTED is not valid JSON: ValueError"),
    "rank-5000-digit-step": (_rank_huge_int, "rank00000.json is not valid JSON: ValueError"),
    "rank-state-a-pickle": (_rank_not_json, "rank00000.json is not valid JSON"),
    "empty-metadata": (_empty_metadata, "state_dict_metadata is empty"),
    "metadata-storage-a-list": (_metadata_storage_list, "storage_data is empty or not a table"),
    "metadata-chunks-a-string": (_metadata_size_strings, "model.tok_embeddings.weight: no chunk list"),
    "metadata-not-a-pickle": (_metadata_not_pickle, "not valid DCP metadata"),
    "metadata-missing": (_metadata_missing, "no DCP .metadata listed in the manifest"),
    "manifest-entry-outside": (_manifest_entry_outside, "manifest names paths outside the checkpoint"),
    "manifest-digest-a-list": (_manifest_digest_list, "malformed SHA-256 in the manifest"),
}


@pytest.mark.parametrize("case", list(PARSE_CASES))
def test_every_parse_failure_is_a_verification_failure(root, case):
    craft, why = PARSE_CASES[case]
    craft(six(root))
    judged_everywhere(root, why)


def test_a_quarantine_path_that_is_a_file_is_one_refusal_not_a_traceback(root):
    """Resume cannot set the bad checkpoint aside: it refuses (exit 3) saying what to move, and moves
    nothing else."""
    from truestep.checkpoint.errors import SetAsideError

    _metadata_not_pickle(six(root))
    (root / QUARANTINE).write_text("not a directory")
    logs = RunLogs(root.parent, attempt=0, enabled=True)
    try:
        with pytest.raises(
            SetAsideError, match=r"quarantine: that path is not a directory\. Move it out of the way"
        ):
            pick_resume(root, CheckpointConfig(), logs)
    finally:
        logs.close()
    assert [p.name for p in step_dirs(root)] == [step_dir_name(6), step_dir_name(3)]


def test_ckpt_views_do_not_walk_through_a_symlink_to_root(root):
    """`step_*` links to / are not checkpoints: list, verify and inspect never descend into them (a walk
    of / would take minutes here), and resume moves the link (not its target) to quarantine/."""
    os.symlink("/", root / step_dir_name(9))
    os.symlink("/", six(root) / "planted-link")
    started = time.perf_counter()
    rc, out, err = run_cli(ckpt_main, "list", root, "--json")
    assert rc == 0, err
    listed = json.loads(out)["checkpoints"]
    assert [e["name"] for e in listed] == [step_dir_name(6), step_dir_name(3)]
    assert "planted-link is a symlink" in listed[0]["reason"]
    rc, out, err = run_cli(ckpt_main, "inspect", six(root), "--json")
    assert rc == 0 and json.loads(out)["verified"] is False
    assert time.perf_counter() - started < 20
    logs = RunLogs(root.parent, attempt=0, enabled=True)
    try:
        assert pick_resume(root, CheckpointConfig(), logs) == 3
    finally:
        logs.close()
    moved = sorted(p.name for p in (root / QUARANTINE).iterdir())
    assert moved[0].startswith("step_00000006.") and moved[1].startswith("step_00000009.")
    assert (root / QUARANTINE / moved[1]).is_symlink() and os.path.isdir("/")
