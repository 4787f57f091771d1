"""Manifest v3 (checkpoint/manifest_shards.py): each rank commits its own manifest shard of item digests,
rank 0 a manifest of one entry per file; a shard missing or taken from another step is caught (by the
structural check, or by the rank that reads it) and the resume falls back, bit for bit. Two ranks'
shards swapped: tests/test_integrity_ranks.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import INPROCESS_JOB, events, loss_bits_by_step, run_in_process
from truestep.checkpoint import hash_counters
from truestep.checkpoint.catalog import MANIFEST, manifest_shard_name, step_dir_name
from truestep.checkpoint.integrity import verification_problem, verify
from truestep.checkpoint.safe_dcp import read_dcp_metadata

RUN = [*INPROCESS_JOB, "--checkpoint.interval=2", "--checkpoint.keep_last_n=0"]
SHARD = manifest_shard_name(0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The in-process reference job stopped at step 6: checkpoints at 2, 4 and 6."""
    run = tmp_path_factory.mktemp("shards") / "run"
    assert run_in_process(run, *RUN, "--train.stop_at_step=6") == 0
    return run


def test_rank0_lists_files_and_shard_digests_not_items(saved: Path) -> None:
    ckpt = saved / "checkpoints" / step_dir_name(6)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    assert manifest["version"] == 3
    on_disk = {p.name for p in ckpt.iterdir()} - {MANIFEST, "COMMITTED"}
    assert set(manifest["files"]) == on_disk
    assert manifest["files"][SHARD]["rank"] == 0
    assert not any("items" in entry for entry in manifest["files"].values())
    items = json.loads((ckpt / SHARD).read_text())["files"]["__0_0.distcp"]["items"]
    assert len(items) == len(read_dcp_metadata(ckpt).storage_data) > len(manifest["files"])
    assert verify(ckpt, checksums=True)["version"] == 3  # every shard, every item, byte for byte


def test_the_counters_show_rank0s_entries_per_file_and_each_ranks_per_item(tmp_path: Path) -> None:
    from integrity_cases import commit, save_shards, small_state

    hash_counters.reset()
    ckpt_dir, writer = save_shards(tmp_path, small_state())
    wrote = hash_counters.snapshot()
    commit(ckpt_dir, writer)
    committed = hash_counters.snapshot()
    assert wrote["shard_entries"] == len(read_dcp_metadata(ckpt_dir).storage_data)
    files = len(json.loads((ckpt_dir / MANIFEST).read_text())["files"])
    assert committed["manifest_entries"] - wrote["manifest_entries"] == files == 3  # .metadata, shard, data


def _missing(ckpt: Path, older: Path) -> None:
    (ckpt / SHARD).unlink()


def _from_older_step(ckpt: Path, older: Path) -> None:
    shutil.copyfile(older / SHARD, ckpt / SHARD)
    size = json.loads((ckpt / MANIFEST).read_text())["files"][SHARD]["size"]
    assert (ckpt / SHARD).stat().st_size == size  # same size: only its digest tells it apart


@pytest.mark.parametrize(("break_it", "structural"), [(_missing, True), (_from_older_step, False)])
def test_a_manifest_shard_missing_or_from_another_step_is_caught_and_resume_falls_back(
    saved: Path, inprocess_reference: Path, tmp_path: Path, break_it, structural: bool
) -> None:
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    ckpt, older = (run / "checkpoints" / step_dir_name(s) for s in (6, 4))
    break_it(ckpt, older)
    assert "manifest.rank00000.json" in (verification_problem(ckpt, checksums=True) or "")
    at_resume = verification_problem(ckpt, checksums=True, items_on_read=True)
    assert (at_resume is not None) == structural, at_resume  # else: found by the rank that reads it
    assert run_in_process(run, *RUN) == 0
    (quarantined,) = events(run, "checkpoint_quarantined")
    assert quarantined["step"] == 6 and SHARD in quarantined["reason"], quarantined
    assert [e["step"] for e in events(run, "checkpoint_restore")] == [4]
    assert loss_bits_by_step(run) == loss_bits_by_step(inprocess_reference)
