"""Hostile checkpoints (issue 12, class 5): the cross-checks between a checkpoint's files (rank state,
manifest, marker, directory name, stored dtypes), links planted in a step directory, and export's refusal
to write over a file. Crafted around copies of the shared reference run's checkpoints and recommitted, as
in tests/test_hostile_checkpoints.py (classes 2-4)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from ckpt_cases import ckpt, file_hashes
from hostile_cases import (
    RANK0,
    SHARD,
    copy_step,
    crafted_root,
    edit_metadata,
    edit_rank_state,
    judged_everywhere,
    mkfifo,
    one_line,
    recommit,
    run_cli,
    six,
    tensor_entry,
    within,
)
from truestep.checkpoint.catalog import MANIFEST, MARKER, step_dir_name
from truestep.checkpoint.integrity import verification_problem, verify
from truestep.checkpoint.manifest import VerifyError
from truestep.checkpoint.resolver import pick_resume
from truestep.checkpoint.weights import WeightsError, load_model_tensors
from truestep.config.schema import CheckpointConfig
from truestep.telemetry.run_logs import RunLogs

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def root(reference: Path, tmp_path: Path) -> Path:
    return crafted_root(reference, tmp_path)


# ---------------------------------------------------------------------------------------------- class 5


def test_a_renamed_directory_does_not_resume_as_its_old_step(root):
    """step_00000006 renamed to step_00000008 with marker and manifest rewritten to say 8: its rank
    state still says 6, so it is not step 8 (resuming it would relabel step 6 as step 8)."""
    d = six(root).rename(root / step_dir_name(8))
    recommit(d)
    with pytest.raises(VerifyError, match="rank00000.json records step 6, the directory and marker say 8"):
        verify(d, checksums=True)
    logs = RunLogs(root.parent, attempt=0, enabled=True)
    try:
        assert pick_resume(root, CheckpointConfig(), logs) == 3
    finally:
        logs.close()


def test_a_step_of_a_billion_in_the_rank_state_is_refused(root):
    def edit(record):
        record["train_state"]["step"] = 10**9

    edit_rank_state(six(root), edit)
    judged_everywhere(root, "rank00000.json records step 1000000000, the directory and marker say 6")


@pytest.mark.parametrize(
    "field,value,why",
    [
        ("rank", 1, "rank00000.json records rank 1"),
        ("layout", {"world_size": 2, "dp": 2, "tp": 1}, "1 rank-state files for world_size 2"),
        ("train_state", {"step": True}, "records step True"),
    ],
)
def test_rank_state_must_match_the_directory(root, field, value, why):
    def edit(record):
        record[field] = value if field != "train_state" else {**record["train_state"], **value}

    edit_rank_state(six(root), edit)
    judged_everywhere(root, why)


def test_manifest_step_must_match(root):
    d = six(root)
    manifest = json.loads((d / MANIFEST).read_text())
    manifest["step"] = 3
    recommit(d, files=manifest["files"])  # recommit writes step 6 into the manifest...
    manifest_path = d / MANIFEST
    blob = json.dumps({**json.loads(manifest_path.read_text()), "step": 3}).encode()
    manifest_path.write_bytes(blob)
    from truestep.checkpoint.manifest import write_marker

    write_marker(d, 6, blob)  # ...so say 3 there after all, consistently with the marker
    judged_everywhere(root, "manifest records step 3, the directory says 6")


def test_a_dtype_the_stored_bytes_contradict_is_refused_when_read(root):
    """The metadata says bfloat16, the stored chunk is float32: DCP would cast silently. Reading refuses
    (verification only sizes and hashes the shards; the resume falls back in process, see
    test_hostile_resume.py)."""
    edit_metadata(
        six(root), lambda m: setattr(tensor_entry(m, "model.norm.weight").properties, "dtype", torch.bfloat16)
    )
    assert verification_problem(six(root), checksums=True) is None
    with pytest.raises(
        WeightsError, match="model.norm.weight: stored as float32, the metadata declares bfloat16"
    ):
        load_model_tensors(six(root))


def test_a_committed_step_directory_that_is_a_symlink_is_never_followed(root, tmp_path):
    """A symlinked step_00000012 is not a checkpoint: not listed, not resumed from, not removed by
    retention (whose rmtree crashed on it), moved to quarantine/ as a link by the resolver."""
    from truestep.checkpoint.catalog import committed_dirs

    elsewhere = copy_step(six(root), tmp_path / "elsewhere", step=12)
    recommit(elsewhere)
    before = file_hashes(elsewhere)
    os.symlink(elsewhere, root / step_dir_name(12))
    assert [p.name for p in committed_dirs(root)] == [step_dir_name(6), step_dir_name(3)]
    logs = RunLogs(root.parent, attempt=0, enabled=True)
    try:
        assert pick_resume(root, CheckpointConfig(), logs) == 6
    finally:
        logs.close()
    assert not os.path.lexists(root / step_dir_name(12))
    assert file_hashes(elsewhere) == before  # the target was not touched


def test_export_to_torch_refuses_an_existing_file(reference, tmp_path):
    from truestep.cli.interop import interop_main

    src = ckpt(reference, 6)
    victim = tmp_path / "weights.pt"
    victim.write_bytes(b"precious")
    link = tmp_path / "link.pt"
    os.symlink(tmp_path / "target-that-does-not-exist", link)
    for dest in (victim, link):
        rc, out, err = run_cli(interop_main, "export", src, "--to", "torch", dest)
        assert rc == 3 and "already exists; refusing to overwrite it" in one_line(err), err
    # refused before the checkpoint is even looked for: no work for an output that cannot be written
    rc, out, err = run_cli(interop_main, "export", tmp_path / "no-such-checkpoint", "--to", "torch", victim)
    assert rc == 3 and "already exists; refusing to overwrite it" in one_line(err), err
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "target-that-does-not-exist").exists()
    rc, out, err = run_cli(interop_main, "export", src, "--to", "torch", tmp_path / "new.pt")
    assert rc == 0, err
    state = torch.load(tmp_path / "new.pt", weights_only=True)
    assert state["norm.weight"].dtype == torch.float32


@pytest.mark.parametrize("plant", ["symlink", "fifo"])
def test_a_link_planted_in_a_checkpoint_being_committed_is_refused_not_published(tmp_path, plant):
    """Someone else writes into the step directory between the shards and the commit: the manifest is
    never written over a symlink's target or a FIFO, no marker is published, and the refusal is one
    RefusedError (exit 3: a human must look at who writes into the run directory)."""
    from concurrent.futures import Future

    from truestep.checkpoint.saver import Checkpointer, PendingSave
    from truestep.checkpoint.shard_writer import ShardWriter
    from truestep.core.errors import RefusedError
    from truestep.parallel.dist import DistContext

    root = tmp_path / "checkpoints"
    d = root / step_dir_name(4)
    d.mkdir(parents=True)
    (d / RANK0).write_text("{}")
    if plant == "symlink":
        (tmp_path / "victim").write_text("precious")
        os.symlink(tmp_path / "victim", d / SHARD)
    else:
        mkfifo(d / SHARD)
    logs = RunLogs(tmp_path, attempt=1, enabled=True)
    checkpointer = Checkpointer(root, CheckpointConfig(), DistContext(), logs, {}, lambda: None, 1)
    done: Future = Future()
    done.set_result(None)
    writer = ShardWriter(d, 4)
    writer.digests = []  # as if DCP had finished: the commit then lists the directory
    pending = PendingSave(4, d, done, time.perf_counter(), "interval", writer)
    try:
        with pytest.raises(RefusedError, match=rf"not committing .*{SHARD} is a (symlink|FIFO)"):
            within(30, lambda: checkpointer._commit(pending))
    finally:
        logs.close()
    assert not (d / MARKER).exists() and not (d / MANIFEST).exists()
    if plant == "symlink":
        assert (tmp_path / "victim").read_text() == "precious"
