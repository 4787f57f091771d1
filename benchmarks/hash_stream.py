"""What hashing exactly the bytes written costs: the shard writer's stream, copy-then-hash, vs hashing the
caller's memory and writing it (the stream before stop 35).

`checkpoint/shard_writer.py` copies each 1 MiB of an item into a buffer of its own, hashes the copy and
writes the copy, so the digest is of exactly the bytes in the file even if the source memory changes
meanwhile (tests/test_resume_check.py, the unstaged save). Before, it hashed the source and wrote the
source: two reads of memory that may be changing. This times both on the same tensor bytes into a real
file (write + fsync, as DCP's `sync_files=True` does), sides in ABBA order, fresh file per trial, for a
few sizes; reported: seconds median [min-max] and the ratio of medians copy/direct.

    OMP_NUM_THREADS=1 python benchmarks/hash_stream.py [--sizes-mib 64,256,1024] [--trials 6]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_common import abba, load, median, spread
from torch.distributed.checkpoint.metadata import MetadataIndex

from truestep.checkpoint.shard_writer import CHUNK_BYTES, _HashingItemStream


class _Direct:
    """The stream before stop 35: hash the caller's memory, then write it."""

    def __init__(self, raw) -> None:  # noqa: ANN001
        self.raw = raw
        self.hash = hashlib.sha256()

    def write(self, data: memoryview) -> None:
        self.hash.update(data)
        self.raw.write(data)


def _copy_then_hash(raw, view: memoryview) -> str:  # noqa: ANN001
    digests: list[str] = []
    stream = _HashingItemStream(raw, MetadataIndex("bench"), lambda _i, sha, _n: digests.append(sha))
    stream.write(view)
    stream.close()
    return digests[0]


def _direct(raw, view: memoryview) -> str:  # noqa: ANN001
    stream = _Direct(raw)
    stream.write(view)
    raw.flush()
    return stream.hash.hexdigest()


SIDES: dict[str, Callable] = {"copy-then-hash": _copy_then_hash, "direct": _direct}


def one(side: str, view: memoryview, folder: Path) -> tuple[float, str]:
    path = folder / f"{side}.bin"
    started = time.perf_counter()
    with open(path, "wb") as raw:
        digest = SIDES[side](raw, view)
        raw.flush()
        os.fsync(raw.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds, digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", default="64,256,1024")
    parser.add_argument("--trials", type=int, default=6, help="trials per side and size (>= 5)")
    args = parser.parse_args()
    if args.trials < 5:
        parser.error("--trials must be >= 5")
    print(f"chunk {CHUNK_BYTES >> 10} KiB; {load()}")
    print("| MiB | copy-then-hash s | direct s | copy/direct |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        for mib in (int(s) for s in args.sizes_mib.split(",")):
            tensor = torch.randn(mib * 2**20 // 4, generator=torch.Generator().manual_seed(mib))
            view = memoryview(tensor.numpy()).cast("B")
            times: dict[str, list[float]] = {side: [] for side in SIDES}
            digests: set[str] = set()
            for side in abba(list(SIDES), args.trials):
                seconds, digest = one(side, view, Path(tmp))
                times[side].append(seconds)
                digests.add(digest)
            if len(digests) != 1:  # both sides hash the same unchanging bytes: they must agree
                raise SystemExit(f"the two streams disagree on {mib} MiB: {digests}")
            ratio = median(times["copy-then-hash"]) / median(times["direct"])
            row = [str(mib), spread(times["copy-then-hash"]), spread(times["direct"]), f"{ratio:.2f}"]
            print("| " + " | ".join(row) + " |", flush=True)
    print(load())


if __name__ == "__main__":
    main()
