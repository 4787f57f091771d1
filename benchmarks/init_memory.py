"""Peak memory per rank of building the training model, meta-device init vs full-model init.

The trainer builds its model with `parallel.build_model`. With `parallel.meta_init=true` (the default)
the model is built on the meta device, sharded (TP x FSDP2), and only then allocated: a rank holds its
shards plus one full parameter at a time while it initializes. With `false` every rank first builds and
initializes the whole model in fp32 and shards it after. Both give the same weights bit for bit
(tests/test_meta_init.py); this measures what each costs.

For each model size and world size W (FSDP over W gloo ranks on this machine's CPUs), in fresh
processes, alternating in ABBA order: every rank reads its peak resident set (`VmHWM`) after the
process group is up and again after the model is built; reported is the busiest rank's growth (GiB)
and its build time, min/median/max over `--trials` (>= 5).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/init_memory.py [--sizes 0.06B,0.25B,0.85B] [--worlds 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import abba, load, spread

GIB = 2**30
SIZES = {  # ModelConfig overrides (vocab 32000); fp32 bytes = 4 x parameters
    "0.06B": ["--model.dim=512", "--model.n_layers=8", "--model.n_heads=8", "--model.n_kv_heads=2"],
    "0.25B": ["--model.dim=1024", "--model.n_layers=16", "--model.n_heads=16", "--model.n_kv_heads=4"],
    "0.85B": ["--model.dim=2048", "--model.n_layers=16", "--model.n_heads=16", "--model.n_kv_heads=4"],
}
COMMON = ["--model.vocab_size=32000", "--model.multiple_of=256"]
SIDES = ("meta", "full")


def peak_bytes() -> int:
    # VmHWM, not ru_maxrss: a spawned child's ru_maxrss can carry its parent's size across exec.
    status = Path("/proc/self/status").read_text().splitlines()
    line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def rank(rank_id: int, world: int, init_file: str, overrides: list[str], out: str) -> None:
    """One gloo rank: the growth of its peak RSS and the seconds that `build_model` takes."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from truestep.config import load_config
    from truestep.parallel.dist import DistContext
    from truestep.parallel.parallelize import build_model

    torch.set_num_threads(1)
    cfg = load_config("tiny", overrides)
    ctx = DistContext()
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank_id, world_size=world)
        mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))
        ctx = DistContext(
            rank=rank_id, world_size=world, dp=world, dp_rank=rank_id, backend="gloo", mesh=mesh
        )
    before = peak_bytes()
    started = time.perf_counter()
    model = build_model(ctx, cfg)
    seconds = time.perf_counter() - started
    grown = peak_bytes() - before
    params = sum(p.numel() for p in model.parameters())  # global numel (DTensor shape)
    Path(out, f"rank{rank_id}.json").write_text(json.dumps({"grown": grown, "s": seconds, "params": params}))
    if world > 1:
        dist.barrier()  # no rank tears the group down while a peer still builds (parallel.dist.leave)
        dist.destroy_process_group()


CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch.multiprocessing as mp
from init_memory import rank
world, out = int(sys.argv[2]), sys.argv[4]
overrides = json.loads(sys.argv[5])
if world == 1:
    rank(0, 1, sys.argv[3], overrides, out)
else:
    mp.spawn(rank, args=(world, sys.argv[3], overrides, out), nprocs=world)
"""


def trial(side: str, size: str, world: int, scratch: Path) -> dict:
    """Fresh processes: the busiest rank's RSS growth (bytes), the slowest rank's build seconds."""
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        overrides = [*COMMON, *SIZES[size], f"--parallel.meta_init={side == 'meta'}".lower()]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        here = str(Path(__file__).resolve().parent)
        argv = [sys.executable, "-c", CHILD, here, str(world), f"{tmp}/init", tmp, json.dumps(overrides)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{side} {size} W={world} failed: {proc.stderr.strip()[-2000:]}")
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    return {
        "grown": max(r["grown"] for r in ranks),
        "s": max(r["s"] for r in ranks),
        "params": ranks[0]["params"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.06B,0.25B,0.85B")
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--trials", type=int, default=5, help="per side, size and world (>= 5)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    if args.trials < 5:
        parser.error("--trials must be >= 5")
    scratch = Path(tempfile.mkdtemp(prefix="init-mem-", dir=args.dir))
    print(f"load at start: {load()}", flush=True)
    rows = []
    for size in args.sizes.split(","):
        for world in (int(w) for w in args.worlds.split(",")):
            seen: dict[str, list[dict]] = {side: [] for side in SIDES}
            for side in abba(SIDES, args.trials):
                result = trial(side, size, world, scratch)
                seen[side].append(result)
                print(
                    f"  {size} W={world} {side}: +{result['grown'] / GIB:.2f} GiB, {result['s']:.2f} s",
                    flush=True,
                )
            params = seen["meta"][0]["params"]
            grown = {side: [r["grown"] / GIB for r in seen[side]] for side in SIDES}
            secs = {side: [r["s"] for r in seen[side]] for side in SIDES}
            ratio = (
                sorted(grown["meta"])[len(grown["meta"]) // 2]
                / sorted(grown["full"])[len(grown["full"]) // 2]
            )
            rows.append(
                f"| {size} | {params / 1e9:.3f} | {params * 4 / GIB:.2f} | {world} | "
                f"{spread(grown['meta'], '{:.2f}')} | {spread(grown['full'], '{:.2f}')} | {ratio:.2f} | "
                f"{spread(secs['meta'], '{:.2f}')} | {spread(secs['full'], '{:.2f}')} |"
            )
    print(f"load at end: {load()}")
    print(
        "| size | parameters (B) | fp32 model (GiB) | ranks | meta: busiest rank's peak growth GiB | "
        "full: same | meta/full | meta: build s | full: build s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
