"""Per-rank integrity on real gloo groups: each rank hashes only the shard it writes, rank 0 commits from
the gathered digests without reading a shard byte, and a byte flipped in rank 1's shard is found by
rank 1 (the rank that reads it) before it reaches a tensor, raised by every rank, and also found across
a layout change (one process reading both ranks' shards). Training-level fallback: tests/test_integrity_fallback.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness import gloo_ranks
from integrity_cases import rank_worker, small_state
from truestep.checkpoint.catalog import manifest_shard_name, step_dir_name
from truestep.checkpoint.errors import CheckpointContentError
from truestep.checkpoint.integrity import verification_problem
from truestep.checkpoint.safe_dcp import load_dcp
from truestep.checkpoint.verified_read import DigestMismatchError

pytestmark = pytest.mark.multiprocess

WORLD = 2


def _run(tmp_path: Path, flip_rank: int | None) -> list[dict]:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    root.mkdir()
    out.mkdir()
    gloo_ranks(rank_worker, (WORLD, str(tmp_path / "init"), str(root), flip_rank, str(out)), WORLD)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_each_rank_hashes_its_own_shard_and_rank0_reads_none_back(tmp_path):
    seen = _run(tmp_path, flip_rank=None)
    for rank, facts in enumerate(seen):
        assert facts["error"] is None, facts
        assert facts["hashed_while_writing"] == facts["own_shard_bytes"], (rank, facts)
        assert facts["hashed_while_reading"] == facts["own_shard_bytes"], (rank, facts)
        assert facts["loaded_bitwise"], rank
    assert seen[0]["digested_files"] == ["__0_0.distcp", "__1_0.distcp"]  # gathered to the coordinator
    assert seen[0]["read_back_by_commit"] < seen[0]["own_shard_bytes"] // 20  # .metadata only
    assert seen[1]["read_back_by_commit"] == 0
    _two_ranks_manifest_shards_swapped_are_caught(tmp_path / "ckpt" / step_dir_name(4))


def _two_ranks_manifest_shards_swapped_are_caught(ckpt_dir: Path) -> None:
    """Each rank committed its own manifest shard; exchanged between the ranks (same sizes: only their
    digests in manifest.json tell them apart) they fail a full verify, and the resume's reader."""
    shards = [ckpt_dir / manifest_shard_name(r) for r in range(WORLD)]
    assert verification_problem(ckpt_dir, checksums=True) is None
    assert shards[0].stat().st_size == shards[1].stat().st_size
    first, second = (s.read_bytes() for s in shards)
    shards[0].write_bytes(second)
    shards[1].write_bytes(first)
    assert (verification_problem(ckpt_dir, checksums=True) or "").startswith(
        "manifest.rank00000.json: SHA-256"
    )
    assert verification_problem(ckpt_dir, checksums=True, items_on_read=True) is None  # left to the reader
    loaded = {f"r{r}": torch.zeros_like(small_state(seed=r)["a"]) for r in range(WORLD)}
    with pytest.raises(CheckpointContentError, match=r"manifest\.rank0000[01]\.json: SHA-256 does not match"):
        load_dcp(loaded, ckpt_dir, no_dist=True, check_items=True)
    assert not any(t.any() for t in loaded.values())  # refused before any item was read


def test_a_byte_flipped_in_rank1s_shard_is_found_by_rank1_and_agreed_by_all(tmp_path):
    seen = _run(tmp_path, flip_rank=1)
    for facts in seen:
        assert facts["error"] is not None and "__1_0.distcp: SHA-256 mismatch (corrupted)" in facts["error"]
        assert "found by rank 1" in facts["error"], facts["error"]
    # The bad item reached no tensor (hashed before it is deserialized); rank 0's good item streamed into
    # its target, and rank 0 raises all the same (DCP gathers rank 1's failure): the caller discards it.
    assert seen[1]["target_untouched"], "a byte that failed its hash was loaded"
    assert seen[0]["loaded_bitwise"], "a good item is streamed into its target, not held back"
    # Resharded: one process reads both ranks' shards and finds the same byte itself.
    ckpt_dir = tmp_path / "ckpt" / step_dir_name(4)
    loaded = {f"r{r}": torch.zeros_like(small_state(seed=r)["a"]) for r in range(WORLD)}
    with pytest.raises(DigestMismatchError, match=r"__1_0\.distcp: .* \(r1\), found by rank 0"):
        load_dcp(loaded, ckpt_dir, no_dist=True, check_items=True)
    assert not loaded["r1"].any()
