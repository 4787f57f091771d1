"""Peak memory per rank, estimated (parallel/memory.py) vs measured, and the step-time cost of
activation checkpointing.

Memory: each side is a real `truestep train` run in a fresh process (or 2 FSDP ranks under torchrun) of
one model: rank 0 logs the estimate it made before building the model (event memory_estimate) and every
rank's measured peak (the process's VmHWM) at the end (run_end peak_mem_bytes_per_rank). A peak is a
deterministic function of the run (one run per side, `--memory-runs` to repeat).

Time: one process, one model, the checkpointing mode switched between forward+backward passes in
counterbalanced order (bench_common.abba) over `--trials` rounds, so load drift on a shared machine hits
every mode alike; reported as median [min-max] seconds per pass and the ratio to `none`.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/memory.py [--trials 7] [--steps 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_common import abba, load, spread

GIB = 2**30
MODEL = [  # 34M parameters, 1024 tokens a step: activations dominate without checkpointing, parameters and state with it
    "--model.dim=512",
    "--model.n_layers=8",
    "--model.n_heads=8",
    "--model.n_kv_heads=2",
    "--model.vocab_size=8192",
    "--model.multiple_of=256",
    "--model.max_seq_len=256",
    "--data.seq_len=256",
    "--train.global_batch_size=4",
    "--checkpoint.interval=0",
    "--checkpoint.async_save=false",
    "--metrics.progress=false",
    "--resilience.heartbeat=false",
]
SIDES = {  # name -> (processes, overrides)
    "none": (1, ["--train.activation_checkpointing=none"]),
    "selective": (1, ["--train.activation_checkpointing=selective"]),
    "full": (1, ["--train.activation_checkpointing=full"]),
    "full, optim.foreach=false": (1, ["--train.activation_checkpointing=full", "--optim.foreach=false"]),
    "none, cpu_return_freed_memory=false": (
        1,
        ["--train.activation_checkpointing=none", "--parallel.cpu_return_freed_memory=false"],
    ),
}
FSDP_SIDES = {  # estimate vs measured under FSDP, one run each (step time is not compared across these)
    "2 ranks, fp32": (2, ["--train.activation_checkpointing=none"]),
    "2 ranks, bf16 (mixed_precision_cpu)": (
        2,
        ["--train.activation_checkpointing=none", "--parallel.mixed_precision_cpu=true"],
    ),
    "2 ranks, bf16, full": (
        2,
        ["--train.activation_checkpointing=full", "--parallel.mixed_precision_cpu=true"],
    ),
}


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(run_dir: Path, nproc: int, overrides: list[str], steps: int) -> dict:
    args = ["train", "tiny", f"--run.dir={run_dir}", *MODEL, f"--train.max_steps={steps}", *overrides]
    if nproc == 1:
        cmd = [sys.executable, "-m", "truestep", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        cmd += ["-m", "truestep", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    events = read(run_dir / "events.jsonl")
    estimate = next(e for e in events if e["event"] == "memory_estimate")
    end = next(e for e in events if e["event"] == "run_end")
    times = [m["step_time"] for m in read(run_dir / "metrics.jsonl")][1:]
    return {
        "estimate": estimate["peak_bytes"],
        "terms": {k: v for k, v in estimate.items() if k.endswith("_bytes")},
        "measured": max(end["peak_mem_bytes_per_rank"]),
        "step_time": statistics.median(times) if times else float("nan"),
    }


MODES = ("none", "selective", "full")


def pass_times(trials: int) -> dict[str, list[float]]:
    """Seconds of one forward+backward of the benchmark model per checkpointing mode, ABBA-ordered."""
    import time

    import torch
    import torch.nn.functional as F

    from truestep.config.load import load_config
    from truestep.model.llama import Transformer
    from truestep.model.recompute import set_activation_checkpointing

    torch.set_num_threads(1)
    cfg = load_config("tiny", [m for m in MODEL if m.startswith(("--model.", "--data."))])
    model = Transformer(cfg.model)
    model.init_weights(0)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.model.vocab_size, (2, cfg.data.seq_len), generator=gen)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for i, mode in enumerate(["none", *abba(list(MODES), trials)]):  # the first pass warms up, unrecorded
        set_activation_checkpointing(model, mode)
        began = time.perf_counter()
        F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
        model.zero_grad(set_to_none=True)
        if i:
            times[mode].append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=7, help="rounds of the timed passes (>= 5)")
    parser.add_argument("--steps", type=int, default=3, help="steps of each memory run")
    parser.add_argument("--memory-runs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the raw results here as JSON")
    a = parser.parse_args()
    print(f"# {load()}", flush=True)
    results: dict[str, list[dict]] = {name: [] for name in [*SIDES, *FSDP_SIDES]}
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(abba(list(results), a.memory_runs)):
            nproc, overrides = {**SIDES, **FSDP_SIDES}[name]
            results[name].append(run(Path(tmp) / f"{i}", nproc, overrides, a.steps))
            print(f"# {name}: {results[name][-1]}", flush=True)
    print(f"\n# memory, {load()}\n")
    print("| side | estimated peak per rank (GiB) | measured peak per rank (GiB) | estimate error |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        est = statistics.median(r["estimate"] for r in runs) / GIB
        got = statistics.median(r["measured"] for r in runs) / GIB
        print(f"| {name} | {est:.2f} | {got:.2f} | {100 * (est - got) / got:+.1f} % |")
    times = pass_times(a.trials)
    base = statistics.median(times["none"])
    print(f"\n# forward+backward time, {a.trials} rounds, {load()}\n")
    print("| activation checkpointing | seconds per pass | vs none |")
    print("|---|---|---|")
    for mode in MODES:
        print(f"| {mode} | {spread(times[mode], '{:.2f}')} | {statistics.median(times[mode]) / base:.2f}x |")
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "memory.json").write_text(json.dumps({"memory": results, "times": times}, indent=1))


if __name__ == "__main__":
    main()
