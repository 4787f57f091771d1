"""Peak memory of `import-hf` and `export --to hf` at model sizes 0.1B, 0.5B and 1.24B (issue 28).

For each size a Hugging Face Llama directory of random bf16 weights is written locally, as a real one
ships (Llama 3.2 shapes: vocab 128256, tied embeddings, GQA), in shards of at most `--shard-gb`, one
shard in memory at a time. Then, in fresh child processes, alternating in ABBA order:

- import: `truestep import-hf SRC --out CKPT` (default dtype: as the source, bf16);
- export: `truestep export CKPT --to hf OUT --dtype bf16 --max-shard-size SHARD` of a checkpoint
  imported once beforehand (not measured).

Each child reports its own peak resident set (`VmHWM`, the process's whole life: interpreter, torch,
the work). A child that only imports the same modules gives the baseline. The bound asserted here (the
issue's): peak <= the largest single shard + 1 GiB, whatever the model size; exit 1 if a trial exceeds
it. min/median/max over `--trials` (>= 5; >= 3 for the largest size).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/interop_memory.py [--sizes 0.1B,0.5B,1.24B] [--trials 5]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_common import abba, load, spread

GIB = 2**30
SIZES = {  # ModelConfig fields; Llama 3.2 1B is the last (1.236B parameters)
    "0.1B": {"dim": 512, "n_layers": 8, "n_heads": 8, "n_kv_heads": 2},
    "0.5B": {"dim": 1536, "n_layers": 9, "n_heads": 24, "n_kv_heads": 8},
    "1.24B": {"dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8},
}
COMMON = {"vocab_size": 128256, "multiple_of": 256, "ffn_dim_multiplier": 1.5, "tie_embeddings": True}
CHILD = """
import json, sys
from truestep.cli.interop import interop_main
rc = interop_main(sys.argv[1:]) if len(sys.argv) > 1 else 0
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0].split()[1]
print(json.dumps({"rc": rc, "peak_kib": int(hwm)}))
"""
# VmHWM, not ru_maxrss: Linux carries the parent's RSS at fork into a child's ru_maxrss across exec, so
# ru_maxrss of a child started from a big parent reads the parent's size; VmHWM belongs to the new image.


def write_source(directory: Path, size: str, shard_bytes: int) -> tuple[int, int]:
    """A random-weight HF directory in bf16 shards; (parameters, bytes of the largest shard)."""
    import torch
    from safetensors.torch import save_file

    from truestep.checkpoint.weights import expected_shapes
    from truestep.config.schema import ModelConfig
    from truestep.interop.hf import hf_config
    from truestep.interop.names import sort_key, to_hf

    cfg = ModelConfig(**SIZES[size], **COMMON, max_seq_len=2048)
    shapes = expected_shapes(cfg)
    fqns = [f for f in sorted(shapes, key=sort_key) if f != "output.weight"]  # tied: HF omits lm_head
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(hf_config(cfg, "bfloat16")))
    generator = torch.Generator().manual_seed(0)
    groups: list[list[str]] = [[]]
    for fqn in fqns:
        nbytes = math.prod(shapes[fqn]) * 2
        if groups[-1] and sum(math.prod(shapes[f]) * 2 for f in groups[-1]) + nbytes > shard_bytes:
            groups.append([])
        groups[-1].append(fqn)
    weight_map, largest = {}, 0
    for i, group in enumerate(groups, 1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        shard = {
            to_hf(f): (torch.randn(shapes[f], generator=generator) * 0.02).to(torch.bfloat16) for f in group
        }
        save_file(shard, str(directory / name), metadata={"format": "pt"})
        largest = max(largest, (directory / name).stat().st_size)
        weight_map.update(dict.fromkeys(shard, name))
        del shard
    index = {
        "metadata": {"total_size": sum(math.prod(shapes[f]) * 2 for f in fqns)},
        "weight_map": weight_map,
    }
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return sum(math.prod(shapes[f]) for f in fqns), largest


def source_in_child(directory: Path, size: str, shard_bytes: int) -> tuple[int, int]:
    """`write_source` in a child process, so this one stays small while it measures."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from interop_memory import write_source; "
        "print(json.dumps(write_source(__import__('pathlib').Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))))"
    )
    here = Path(__file__).resolve().parent
    proc = subprocess.run(
        [sys.executable, "-c", code, str(here), str(directory), size, str(shard_bytes)],
        capture_output=True,
        text=True,
        check=True,
    )
    params, largest = json.loads(proc.stdout.strip().splitlines()[-1])
    return params, largest


def child(*argv: object) -> int:
    """Peak RSS in bytes of a fresh process running `truestep <argv>` (no argv: the baseline)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, argv)], capture_output=True, text=True, env=env, check=False
    )
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"rc": proc.returncode}
    if result.get("rc") != 0 or proc.returncode != 0:
        raise SystemExit(f"child {argv} failed (rc {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return int(result["peak_kib"]) * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.1B,0.5B,1.24B")
    parser.add_argument("--trials", type=int, default=5, help="per side and size (>= 3 used for 1.24B)")
    parser.add_argument("--shard-gb", type=float, default=1.0, help="source and export shard size (GB)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="interop-mem-", dir=args.dir))
    shard_bytes = int(args.shard_gb * 10**9)
    print(f"load at start: {load()}", flush=True)
    baseline = [child() for _ in range(3)]
    print(
        f"baseline (python + torch + truestep imported): {spread([b / GIB for b in baseline])} GiB",
        flush=True,
    )
    rows, ok = [], True
    try:
        for size in args.sizes.split(","):
            src = scratch / size / "hf"
            params, largest = source_in_child(src, size, shard_bytes)
            ready = scratch / size / "ready"
            child("import-hf", src, "--out", ready)
            trials = max(3, args.trials) if size == "1.24B" else max(5, args.trials)
            peaks: dict[str, list[float]] = {"import": [], "export": []}
            for n, side in enumerate(abba(("import", "export"), trials)):
                out = scratch / size / f"{side}-{n}"
                if side == "import":
                    peak = child("import-hf", src, "--out", out)
                else:
                    peak = child(
                        "export",
                        ready,
                        "--to",
                        "hf",
                        out,
                        "--dtype",
                        "bf16",
                        "--max-shard-size",
                        f"{args.shard_gb}GB",
                    )
                shutil.rmtree(out)
                peaks[side].append(peak / GIB)
                print(f"  {size} {side}: {peak / GIB:.2f} GiB", flush=True)
            bound = largest / GIB + 1
            for side, values in peaks.items():
                within = max(values) <= bound
                ok &= within
                rows.append(
                    f"| {size} | {params / 1e9:.3f} | {largest / GIB:.2f} | {side} | {spread(values, '{:.2f}')} "
                    f"| {bound:.2f} | {'yes' if within else 'NO'} |"
                )
            shutil.rmtree(scratch / size)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"load at end: {load()}")
    print(
        "| size | parameters (B) | largest shard (GiB) | side | peak RSS GiB median [min-max] | bound (GiB) | within |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
