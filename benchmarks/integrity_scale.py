"""Integrity at size and at scale: what hashing costs now that each rank hashes what it writes (while
writing, beside the write) and what it loads (while loading, each item before it is deserialized), next
to the disk's own limits and to the old way (rank 0 hashes every file after the write and again before
the load), measured side by side in one run.

size sweep (one process, plain fp32 tensors of --sizes GB in 64 MiB pieces), per trial in a rotated and
reversed order (bench_common.abba), every checkpoint's pages evicted before it is read:
  raw        one sequential write of the same bytes + fsync (the disk's limit);
  save       ShardWriter dcp.save (SHA-256 beside the write, this rank's manifest shard) + manifest v3 +
             marker (today's sync save);
  save_v1    stock FileSystemWriter dcp.save + manifest v1 (rank 0 re-reads and hashes every file) + marker;
  resume     structural verify + dcp.load through the safe reader, each item hashed as read and streamed
             into its target once its hash matched (today's resume);
  resume_v1  verify with SHA-256 of every file, then the safe dcp.load (the old resume);
  load       a plain stock dcp.load of the same checkpoint (no checks at all).
(--sides picks some; the targets of issue 37 are save/raw <= 1.5 and resume/load <= 1.2.)
world sweep (--world 1 2 4 gloo ranks, --per-rank-mb each in --piece-mb tensors, new and old protocol
alternating, --world-trials each): from hash_counters, not timing: the busiest rank's hashed bytes as a
fraction of the checkpoint, the bytes read back only to hash (extra read passes), and the entries rank 0
wrote into manifest.json (v3: one per file; a v2 manifest held one per storage item, the items column);
then the save+commit time (rank 0, barrier to barrier) and the slowest rank's cold resume time.

    OMP_NUM_THREADS=1 python benchmarks/integrity_scale.py [--sizes 0.3 1] [--trials 5] [--world 1 2 4]
        [--per-rank-mb 128] [--piece-mb 64] [--sides raw save load resume] [--dir /path/on/the/checkpoint/fs]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from bench_common import abba, load, median, spread
from checkpoint_cost import evict

from truestep.checkpoint import hash_counters
from truestep.checkpoint.catalog import step_dir_name
from truestep.checkpoint.integrity import verify
from truestep.checkpoint.manifest import write_manifest, write_marker
from truestep.checkpoint.manifest_shards import write_manifest_v3
from truestep.checkpoint.safe_dcp import load_dcp, read_dcp_metadata
from truestep.checkpoint.shard_writer import ShardWriter

warnings.filterwarnings("ignore", message="torch.distributed is disabled")
PIECE = 16 << 20  # elements (64 MiB of fp32) per tensor
SIDES = ("raw", "save", "save_v1", "resume", "resume_v1", "load")


def make_state(nbytes: int, prefix: str = "", piece: int = PIECE) -> dict[str, torch.Tensor]:
    left, state, i = nbytes // 4, {}, 0
    while left > 0:
        n = min(piece, left)
        state[f"{prefix}w{i}"] = torch.rand(n, generator=torch.Generator().manual_seed(i))
        left, i = left - n, i + 1
    return state


def save(root: Path, state: dict[str, torch.Tensor], new: bool, no_dist: bool = True) -> Path:
    ckpt_dir = root / step_dir_name(1)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    if new:
        writer = ShardWriter(ckpt_dir, 1)
        dcp.save(state, storage_writer=writer, no_dist=no_dist)
        if not dist.is_initialized() or dist.get_rank() == 0:
            assert writer.digests is not None
            write_marker(ckpt_dir, 1, write_manifest_v3(ckpt_dir, 1, writer.digests))
    else:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(ckpt_dir, sync_files=True), no_dist=no_dist)
        if not dist.is_initialized() or dist.get_rank() == 0:  # the old commit: rank 0 re-reads every file
            write_marker(ckpt_dir, 1, write_manifest(ckpt_dir, 1))
    return ckpt_dir


def resume(ckpt_dir: Path, state: dict[str, torch.Tensor], new: bool, no_dist: bool = True) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        verify(ckpt_dir, checksums=True, items_on_read=new)
    if dist.is_initialized():
        dist.barrier()
    load_dcp(state, ckpt_dir, no_dist=no_dist, check_items=new)


RAW_CHUNK = os.urandom(64 << 20)


def raw_write(path: Path, nbytes: int) -> None:
    chunk = RAW_CHUNK
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, chunk[: min(left, len(chunk))])
        os.fsync(fd)
    finally:
        os.close(fd)


def size_sweep(base: Path, gb: float, trials: int, sides: tuple[str, ...]) -> dict[str, list[float]]:
    nbytes = int(gb * 1e9)
    state = make_state(nbytes)
    into = {k: torch.empty_like(v) for k, v in state.items()}
    keep = {"new": save(base / "keep-new", state, True)}
    if "resume_v1" in sides:
        keep["v1"] = save(base / "keep-v1", state, False)
    res: dict[str, list[float]] = defaultdict(list)
    for side in abba(sides, trials):
        scratch = base / "scratch"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        if side.startswith("resume") or side == "load":
            ckpt_dir = keep["new" if side != "resume_v1" else "v1"]
            evict(ckpt_dir)
        started = time.perf_counter()
        if side == "raw":
            raw_write(scratch / "raw.bin", nbytes)
        elif side.startswith("save"):
            save(scratch, state, side == "save")
        elif side.startswith("resume"):
            resume(ckpt_dir, into, side == "resume")
        else:
            dcp.load(into, storage_reader=dcp.FileSystemReader(ckpt_dir), no_dist=True)
        res[side].append(time.perf_counter() - started)
        evict(scratch)
    shutil.rmtree(base / "scratch", ignore_errors=True)
    for d in keep.values():
        shutil.rmtree(d.parent)
    return res


def _rank(rank: int, world: int, init: str, root: str, per_rank: int, piece: int, out: str, v2: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        state = make_state(per_rank, prefix=f"r{rank}.", piece=piece)
        hash_counters.reset()
        dist.barrier()
        started = time.perf_counter()
        save(Path(root), state, v2, no_dist=False)
        dist.barrier()
        save_s = time.perf_counter() - started
        wrote = hash_counters.snapshot()
        ckpt_dir = Path(root) / step_dir_name(1)
        evict(ckpt_dir)
        dist.barrier()
        hash_counters.reset()
        started = time.perf_counter()
        resume(ckpt_dir, {k: torch.empty_like(v) for k, v in state.items()}, v2, no_dist=False)
        took = time.perf_counter() - started
        read = hash_counters.snapshot()
        facts = {"wrote": wrote, "read": read, "resume_s": took, "save_s": save_s}
        Path(out, f"rank{rank}.json").write_text(json.dumps(facts))
        dist.barrier()  # no rank tears the group down while a peer is still in a collective
    finally:
        dist.destroy_process_group()


def world_trial(base: Path, world: int, per_rank: int, piece: int, v2: bool) -> dict[str, float]:
    """One save + cold resume by `world` gloo ranks, `per_rank` bytes each, the new protocol (each rank
    hashes what it writes and reads, writes its manifest shard; rank 0 one manifest entry per file) or
    the old (v1: rank 0 re-reads and hashes every file at the commit and again before the load)."""
    run = base / f"world{world}"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    mp.spawn(_rank, args=(world, str(run / "init"), str(run), per_rank, piece, str(run), v2), nprocs=world)
    facts = [json.loads((run / f"rank{r}.json").read_text()) for r in range(world)]
    total = sum(p.stat().st_size for p in (run / step_dir_name(1)).glob("*.distcp"))
    items = len(read_dcp_metadata(run / step_dir_name(1)).storage_data)
    shutil.rmtree(run)
    hashed = [f["wrote"]["while_writing"] + f["wrote"]["read_back"] for f in facts]
    verified = [f["read"]["while_reading"] + f["read"]["read_back"] for f in facts]
    return {
        "write_busiest": max(hashed) / total,
        "read_busiest": max(verified) / total,
        "read_back_passes": sum(f["wrote"]["read_back"] + f["read"]["read_back"] for f in facts) / total,
        "save_s": facts[0]["save_s"],
        "resume_s": max(f["resume_s"] for f in facts),
        "rank0_manifest_entries": facts[0]["wrote"]["manifest_entries"],
        "busiest_shard_entries": max(f["wrote"]["shard_entries"] for f in facts),
        "items": items,
    }


def world_sweep(
    base: Path, world: int, per_rank: int, piece: int, trials: int
) -> dict[str, dict[str, list[float]]]:
    """Both protocols, `trials` times each, in alternating order."""
    res: dict[str, dict[str, list[float]]] = {"v2": defaultdict(list), "v1": defaultdict(list)}
    for side in abba(("v2", "v1"), trials):
        for key, value in world_trial(base, world, per_rank, piece, side == "v2").items():
            res[side][key].append(value)
    return res


def sha256_rate(nbytes: int = 256 << 20) -> float:
    data = os.urandom(nbytes)
    started = time.perf_counter()
    hashlib.sha256(data).digest()
    return nbytes / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=float, nargs="*", default=[0.3, 1.0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--world", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--per-rank-mb", type=int, default=128)
    parser.add_argument("--piece-mb", type=int, default=64, help="tensor size in the world sweep")
    parser.add_argument("--sides", nargs="*", default=list(SIDES), choices=SIDES)
    parser.add_argument("--world-trials", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="integrity-scale-", dir=args.dir))
    try:
        print(f"# {load()}; SHA-256 {sha256_rate() / 1e9:.2f} GB/s on one core", flush=True)
        for gb in args.sizes:
            sides = tuple(args.sides)
            res = size_sweep(base, gb, args.trials, sides)
            raw, plain = median(res["raw"]), median(res["load"])
            print(f"## size {gb} GB, {args.trials} trials: seconds median [min-max]; {load()}")
            for side in sides:
                ratio = median(res[side]) / (raw if side.startswith("save") else plain)
                vs = "raw" if side.startswith("save") else "load"
                print(
                    f"  {side:10s} {spread(res[side])}  ({ratio:.2f}x {vs})"
                    if side not in ("raw", "load")
                    else f"  {side:10s} {spread(res[side])}",
                    flush=True,
                )
        for world in args.world:
            got = world_sweep(base, world, args.per_rank_mb << 20, args.piece_mb << 18, args.world_trials)
            print(
                f"## world {world}, {args.per_rank_mb} MiB per rank in {args.piece_mb} MiB tensors, "
                f"{args.world_trials} trials; {load()}"
            )
            for side, label in (
                ("v2", "new (each rank hashes its bytes)"),
                ("v1", "old (rank 0 hashes all)"),
            ):
                r = got[side]
                print(
                    f"  {label:34s} busiest rank hashed {median(r['write_busiest']):.3f} of the checkpoint at "
                    f"save, {median(r['read_busiest']):.3f} at resume; read back only to hash "
                    f"{median(r['read_back_passes']):.3f} passes; rank 0 wrote "
                    f"{median(r['rank0_manifest_entries']):.0f} manifest entries for {median(r['items']):.0f} "
                    f"items (busiest shard {median(r['busiest_shard_entries']):.0f}); save+commit "
                    f"{spread(r['save_s'])} s, resume {spread(r['resume_s'])} s",
                    flush=True,
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
