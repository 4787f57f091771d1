"""Integrity that scales with the ranks: shards are hashed while written (the commit reads none of them
back) and while read for the load (verification adds no read pass); a flipped byte is found by the
reader before it reaches a tensor. Single process, real DCP; the multi-rank cases are in
tests/test_integrity_ranks.py."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from integrity_cases import (
    bytes_read_by_this_process,
    commit,
    flip_byte_of,
    rewrite_as_v2,
    save_shards,
    shard_bytes,
    small_state,
)
from truestep.checkpoint import hash_counters
from truestep.checkpoint.catalog import MANIFEST
from truestep.checkpoint.errors import CheckpointContentError
from truestep.checkpoint.integrity import verify
from truestep.checkpoint.manifest import VerifyError, write_manifest, write_marker
from truestep.checkpoint.safe_dcp import load_dcp, read_dcp_metadata
from truestep.checkpoint.verified_read import DigestMismatchError


def _zeros_like(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in state.items()}


def _metadata_bytes(ckpt_dir) -> int:
    return (ckpt_dir / ".metadata").stat().st_size


def test_commit_hashes_every_shard_byte_while_writing_and_reads_none_back(tmp_path):
    hash_counters.reset()
    ckpt_dir, writer = save_shards(tmp_path, small_state())
    total = shard_bytes(ckpt_dir)
    assert hash_counters.snapshot()["while_writing"] == total
    before = bytes_read_by_this_process()
    commit(ckpt_dir, writer)
    read = bytes_read_by_this_process() - before
    # Only .metadata is hashed whole (rank 0 wrote it); not one shard byte is read to commit.
    assert hash_counters.snapshot()["read_back"] == _metadata_bytes(ckpt_dir)
    assert read < total // 20, (read, total)
    manifest = json.loads((ckpt_dir / MANIFEST).read_text())
    assert manifest["version"] == 3
    (shard,) = [name for name in manifest["files"] if name.endswith(".distcp")]
    assert manifest["files"][shard] == {"size": total, "shard": "manifest.rank00000.json"}  # no items
    items = json.loads((ckpt_dir / "manifest.rank00000.json").read_text())["files"][shard]["items"]
    assert sum(length for _, length, _ in items) == total
    verify(ckpt_dir, checksums=True)  # the offline check agrees, byte for byte


def test_resume_reads_each_shard_byte_once_and_hashes_it_then(tmp_path):
    state = small_state()
    ckpt_dir, writer = save_shards(tmp_path, state)
    commit(ckpt_dir, writer)
    total = shard_bytes(ckpt_dir)
    hash_counters.reset()
    before = bytes_read_by_this_process()
    verify(ckpt_dir, checksums=True, items_on_read=True)  # what the resolver runs before the load
    loaded = _zeros_like(state)
    load_dcp(loaded, ckpt_dir, no_dist=True, check_items=True)
    read = bytes_read_by_this_process() - before
    counters = hash_counters.snapshot()
    assert counters["while_reading"] == total
    assert counters["read_back"] == _metadata_bytes(ckpt_dir)  # the manifest shard: by its reader
    # One pass over the shards (plus the small files), where verify-then-load read them twice.
    assert read < total * 1.1, (read, total)
    for key, value in state.items():
        assert torch.equal(loaded[key].view(torch.int32), value.view(torch.int32)), key


def test_a_flipped_byte_is_caught_while_reading_and_never_reaches_the_tensor(tmp_path):
    state = small_state()
    ckpt_dir, writer = save_shards(tmp_path, state)
    commit(ckpt_dir, writer)
    info = next(i for idx, i in read_dcp_metadata(ckpt_dir).storage_data.items() if idx.fqn == "b")
    flip_byte_of(ckpt_dir, info.relative_path, info.offset + info.length // 2)  # inside the data of b
    verify(ckpt_dir, checksums=True, items_on_read=True)  # structure is intact: left to the reader
    loaded = _zeros_like(state)
    with pytest.raises(
        DigestMismatchError, match=r"SHA-256 mismatch \(corrupted\) in bytes .* \(b\), found by rank 0"
    ):
        load_dcp(loaded, ckpt_dir, no_dist=True, check_items=True)
    assert not loaded["b"].any(), "a tensor whose bytes failed their hash was written into"
    with pytest.raises(VerifyError, match=rf"{info.relative_path}: SHA-256 mismatch \(corrupted\) in bytes"):
        verify(ckpt_dir, checksums=True)  # `ckpt verify` still checks every byte


@pytest.mark.parametrize("version", [2, 3])
def test_item_digests_must_tile_the_shard(tmp_path, version: int):
    ckpt_dir, writer = save_shards(tmp_path, small_state())
    commit(ckpt_dir, writer)
    if version == 2:
        rewrite_as_v2(ckpt_dir)
        manifest = json.loads((ckpt_dir / MANIFEST).read_text())
        shard = next(name for name in manifest["files"] if name.endswith(".distcp"))
        del manifest["files"][shard]["items"][1]  # a range no digest covers
    else:  # the manifest shard, re-bound all the way up so that only the tiling is wrong
        described = json.loads((ckpt_dir / "manifest.rank00000.json").read_text())
        del next(iter(described["files"].values()))["items"][1]
        shard_blob = json.dumps(described).encode()
        (ckpt_dir / "manifest.rank00000.json").write_bytes(shard_blob)
        manifest = json.loads((ckpt_dir / MANIFEST).read_text())
        manifest["files"]["manifest.rank00000.json"].update(
            size=len(shard_blob), sha256=hashlib.sha256(shard_blob).hexdigest()
        )
    blob = json.dumps(manifest).encode()
    (ckpt_dir / MANIFEST).write_bytes(blob)
    write_marker(ckpt_dir, 4, blob)
    checks = (False, True) if version == 2 else (True,)  # v3: found by reading the manifest shard
    for checksums in checks:
        with pytest.raises(VerifyError, match="item digests do not tile the file"):
            verify(ckpt_dir, checksums=checksums, items_on_read=False)
    with pytest.raises(CheckpointContentError, match="item digests do not tile the file"):
        load_dcp(_zeros_like(small_state()), ckpt_dir, no_dist=True, check_items=True)


def test_an_old_v2_checkpoint_still_verifies_and_loads_item_by_item(tmp_path):
    state = small_state()
    ckpt_dir, writer = save_shards(tmp_path, state)
    commit(ckpt_dir, writer)
    rewrite_as_v2(ckpt_dir)
    assert json.loads((ckpt_dir / MANIFEST).read_text())["version"] == 2
    verify(ckpt_dir, checksums=True)
    verify(ckpt_dir, checksums=True, items_on_read=True)
    hash_counters.reset()
    loaded = _zeros_like(state)
    load_dcp(loaded, ckpt_dir, no_dist=True, check_items=True)
    assert hash_counters.snapshot()["while_reading"] == shard_bytes(ckpt_dir)
    assert torch.equal(loaded["b"].view(torch.int32), state["b"].view(torch.int32))


def test_a_v1_manifest_is_still_read_and_hashed_whole_before_the_load(tmp_path):
    state = small_state()
    ckpt_dir, _ = save_shards(tmp_path, state)
    write_marker(ckpt_dir, 4, write_manifest(ckpt_dir, 4))
    hash_counters.reset()
    verify(ckpt_dir, checksums=True, items_on_read=True)
    assert hash_counters.snapshot()["read_back"] >= shard_bytes(ckpt_dir)
    loaded = _zeros_like(state)
    load_dcp(loaded, ckpt_dir, no_dist=True, check_items=True)
    assert torch.equal(loaded["a"].view(torch.int32), state["a"].view(torch.int32))


def test_an_item_digest_is_of_the_bytes_written_even_if_the_source_changes_meanwhile():
    """The shard stream hashes the bytes that reach the file, not the caller's memory: here the file
    changes the source (as training does to an unstaged save's live tensors) before it takes the bytes.
    Hashing the source and then writing it recorded the digest of bytes that were never written."""
    import hashlib

    from torch.distributed.checkpoint.metadata import MetadataIndex

    from truestep.checkpoint.shard_writer import CHUNK_BYTES, _HashingItemStream

    source = bytearray(b"\x01" * (2 * CHUNK_BYTES + 123))
    written = bytearray()

    class SourceChangingFile:
        def write(self, data) -> int:
            source[:] = b"\x02" * len(source)  # the source moves on before the file reads the bytes
            written.extend(data)
            return len(data)

        def flush(self) -> None:
            pass

    recorded: list[str] = []
    stream = _HashingItemStream(
        SourceChangingFile(), MetadataIndex("w"), lambda _i, sha, _n: recorded.append(sha)
    )
    assert stream.write(memoryview(source)) == len(source)
    stream.close()
    assert len(written) == len(source)
    assert recorded == [hashlib.sha256(written).hexdigest()]


def test_the_hash_runs_beside_the_write_not_before_it():
    """The writing thread hands each copied chunk to the hashing thread and writes it at once: here the
    hashing thread runs nothing until the test lets it, and every chunk is in the file already. The
    digest recorded at close is still of exactly the bytes written."""
    import hashlib
    from concurrent.futures import Future

    from torch.distributed.checkpoint.metadata import MetadataIndex

    from truestep.checkpoint.shard_writer import CHUNK_BYTES, IN_FLIGHT, _HashingItemStream

    held: list[tuple[Future, object, tuple]] = []

    class HeldHasher:  # an executor that runs a task only when released
        def submit(self, fn, *args):
            done: Future = Future()
            held.append((done, fn, args))
            return done

    def release() -> None:
        for done, fn, args in held:
            done.set_result(fn(*args))
        held.clear()

    source = bytes(range(256)) * ((IN_FLIGHT - 1) * CHUNK_BYTES // 256) + b"tail"
    written = bytearray()

    class File:
        def write(self, data) -> int:
            written.extend(data)
            return len(data)

        def flush(self) -> None:
            pass

    recorded: list[str] = []
    stream = _HashingItemStream(
        File(), MetadataIndex("w"), lambda _i, sha, _n: recorded.append(sha), HeldHasher()
    )
    assert stream.write(memoryview(source)) == len(source)
    assert bytes(written) == source and len(held) == IN_FLIGHT  # all written, none hashed yet
    release()
    stream.close()
    assert recorded == [hashlib.sha256(source).hexdigest()]
