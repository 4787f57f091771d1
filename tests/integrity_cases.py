"""Shared pieces of the scaled-integrity tests: a small DCP state saved through the training save's
storage writer and committed with manifest v3 exactly as `Checkpointer._commit` does (or rewritten as
an old v2 checkpoint), and a counter of the bytes this process reads (the kernel's own `rchar`: every
read() by any code path or thread)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from truestep.checkpoint.catalog import MANIFEST, step_dir_name
from truestep.checkpoint.manifest import write_manifest_v2, write_marker
from truestep.checkpoint.manifest_shards import write_manifest_v3
from truestep.checkpoint.safe_dcp import single_process
from truestep.checkpoint.shard_writer import ShardWriter

STEP = 4


def bytes_read_by_this_process() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no rchar line")


def small_state(seed: int = 0, scale: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(256 * scale, 1024, generator=gen),
        "b": torch.randn(512 * scale, 512, generator=gen),
        "c": torch.randn(64, generator=gen),
    }


def save_shards(root: Path, state: dict[str, torch.Tensor], no_dist: bool = True) -> tuple[Path, ShardWriter]:
    """The shard write of a save (no commit yet); returns the directory and the writer."""
    ckpt_dir = root / step_dir_name(STEP)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(ckpt_dir, STEP)
    with single_process():
        dcp.save(state, storage_writer=writer, no_dist=no_dist)
    return ckpt_dir, writer


def commit(ckpt_dir: Path, writer: ShardWriter) -> None:
    """What `Checkpointer._commit` does on rank 0 (without the fence and retention)."""
    assert writer.digests is not None
    write_marker(ckpt_dir, STEP, write_manifest_v3(ckpt_dir, STEP, writer.digests))


def rewrite_as_v2(ckpt_dir: Path) -> None:
    """Make a committed v3 checkpoint the v2 checkpoint a save before round 3 wrote: every rank's item
    digests in manifest.json, no manifest shards."""
    manifest = json.loads((ckpt_dir / MANIFEST).read_text())
    items: dict[str, list] = {}
    for name, entry in manifest["files"].items():
        if "rank" in entry:
            items.update(
                {f: e["items"] for f, e in json.loads((ckpt_dir / name).read_text())["files"].items()}
            )
            (ckpt_dir / name).unlink()
    write_marker(ckpt_dir, STEP, write_manifest_v2(ckpt_dir, STEP, items))


def shard_bytes(ckpt_dir: Path) -> int:
    return sum(p.stat().st_size for p in ckpt_dir.glob("*.distcp"))


def flip_byte_of(ckpt_dir: Path, name: str, offset: int) -> None:
    data = bytearray((ckpt_dir / name).read_bytes())
    data[offset] ^= 0x40
    (ckpt_dir / name).write_bytes(bytes(data))


def rank_worker(rank: int, world: int, init_file: str, root: str, flip_rank: int | None, out: str) -> None:
    """One gloo rank (torch.multiprocessing.spawn): save its own tensor, let rank 0 commit from the
    gathered digests, optionally flip a byte in `flip_rank`'s shard, then load with item checks and
    write what this rank saw to `out/rankN.json`."""
    import json

    import torch.distributed as dist

    from truestep.checkpoint import hash_counters
    from truestep.checkpoint.errors import CheckpointContentError
    from truestep.checkpoint.safe_dcp import load_dcp

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        hash_counters.reset()
        state = {f"r{rank}": small_state(seed=rank)["a"]}
        ckpt_dir, writer = save_shards(Path(root), state, no_dist=False)
        wrote = hash_counters.snapshot()
        if rank == 0:
            commit(ckpt_dir, writer)
        committed = hash_counters.snapshot()
        dist.barrier()
        if rank == 0 and flip_rank is not None:
            name = f"__{flip_rank}_0.distcp"
            flip_byte_of(ckpt_dir, name, (ckpt_dir / name).stat().st_size // 2)
        dist.barrier()
        loaded = {key: torch.zeros_like(value) for key, value in state.items()}
        error = None
        try:
            load_dcp(loaded, ckpt_dir, check_items=True)
        except CheckpointContentError as err:
            error = str(err)
        (Path(out) / f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "error": error,
                    "own_shard_bytes": (ckpt_dir / f"__{rank}_0.distcp").stat().st_size,
                    "hashed_while_writing": wrote["while_writing"],
                    "read_back_by_commit": committed["read_back"] - wrote["read_back"],
                    "hashed_while_reading": hash_counters.snapshot()["while_reading"],
                    "loaded_bitwise": torch.equal(
                        loaded[f"r{rank}"].view(torch.int32), state[f"r{rank}"].view(torch.int32)
                    ),
                    "target_untouched": not loaded[f"r{rank}"].any(),
                    "digested_files": sorted(f for r in writer.digests for f in r["files"])
                    if writer.digests is not None
                    else None,
                }
            )
        )
        dist.barrier()  # no rank tears the group down while a peer is still in a collective (test_meta_init)
    finally:
        dist.destroy_process_group()
