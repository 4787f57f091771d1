"""prepare-data at corpus scale, side by side in one run (issue 23).

1. Throughput: `truestep prepare-data` (JSONL and its Parquet copy, N workers) vs the tokenizer library's
   own batch encoding (`encode_batch_fast`, N Rust threads) over the same documents: the limit. The
   library side is charged only its encode calls (reading and JSON parsing are not timed), so the ratio
   cannot flatter prepare-data, which pays for reading, parsing, IPC and writing. Target >= 0.8x.
2. Memory: peak RSS of the whole prepare-data process tree (main + workers, summed, sampled every 20 ms)
   on the first quarter of the corpus vs all of it. Target: within 10 %.
3. Training: median wall time per step (batch fetch + step) of a 3-source mixture vs one source.
   Target: mixture/one >= 0.98x in throughput (step-time ratio one/mixture).

Sides run in ABBA order, min/median/max over the trials (>= 3 for the GB sizes, >= 5 for step time).
The generated corpus is deleted at the end unless --keep.

    nice -n 10 python benchmarks/data_prep.py --gb 1.0 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_common import abba, load, median, spread

PY = sys.executable
EOT = "<|end_of_text|>"


# -- the corpus ------------------------------------------------------------------------------------


def make_corpus(root: Path, gb: float, seed: int = 0) -> tuple[Path, Path, Path]:
    """A JSONL corpus of `gb` GB (Zipf words, 100-6000 character documents), its first quarter, and a
    Parquet copy of the whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    words = ["".join(rng.choice(letters, size=rng.integers(1, 10))) for _ in range(30_000)]
    probs = 1.0 / np.arange(1, len(words) + 1) ** 1.1
    probs /= probs.sum()
    full, quarter = root / "corpus.jsonl", root / "quarter.jsonl"
    writer = pq.ParquetWriter(root / "corpus.parquet", pa.schema([("id", pa.int64()), ("text", pa.string())]))
    target, written, doc_id = int(gb * 1e9), 0, 0
    with open(full, "wb") as f, open(quarter, "wb") as q:
        while written < target:
            ids = rng.choice(len(words), size=400_000, p=probs)
            flat = " ".join(words[i] for i in ids)
            cuts = np.cumsum(rng.integers(100, 6000, size=len(flat) // 100))
            cuts = cuts[cuts < len(flat)]
            docs = [flat[a:b].strip() + "." for a, b in zip([0, *cuts[:-1]], cuts, strict=True)]
            lines = "".join(json.dumps({"id": doc_id + k, "text": d}) + "\n" for k, d in enumerate(docs))
            data = lines.encode()
            f.write(data)
            if written < target // 4:
                q.write(data)
            writer.write_table(pa.table({"id": list(range(doc_id, doc_id + len(docs))), "text": docs}))
            written += len(data)
            doc_id += len(docs)
    writer.close()
    return full, quarter, root / "corpus.parquet"


def train_tokenizer(root: Path, sample: Path) -> Path:
    """A 16k byte-level BPE trained on the first 20 MB of the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=16_000, special_tokens=[EOT], show_progress=False)

    def texts():
        with open(sample, "rb") as f:
            for n, line in enumerate(f):
                if n * 3000 > 20e6:
                    return
                yield json.loads(line)["text"]

    tok.train_from_iterator(texts(), trainer=trainer)
    path = root / "tok" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    return path


# -- measuring a process tree ----------------------------------------------------------------------


def _tree_rss(pid: int) -> int:
    """RSS bytes of `pid` and all its descendants (from /proc)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """(wall seconds, peak tree RSS bytes, stdout) of `cmd`."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.02)
    wall = time.perf_counter() - start
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return wall, peak, out


LIBRARY = """
import json, os, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
tokens, spent, batch = 0, 0.0, []
def flush():
    global tokens, spent, batch
    t = time.perf_counter()
    encs = encode(batch, add_special_tokens=False)
    spent += time.perf_counter() - t
    tokens += sum(len(e.ids) for e in encs) + len(batch)  # + one EOS per document, as prepare-data writes
    batch = []
with open(sys.argv[2], "rb") as f:
    for line in f:
        batch.append(json.loads(line)["text"])
        if len(batch) == 4096:
            flush()
flush()
print(json.dumps({"tokens": tokens, "encode_s": spent}))
"""


def prepare(inp: Path, out: Path, tok: Path, workers: int, env: dict[str, str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [PY, "-m", "truestep", "prepare-data", str(inp), "--out", str(out), "--tokenizer", str(tok)]
    wall, peak, _ = run_measured([*cmd, "--workers", str(workers), "--no-progress"], env)
    meta = json.loads((out / "meta.json").read_text())
    shutil.rmtree(out)
    return {"s": wall, "tokens": meta["num_tokens"], "tok_s": meta["num_tokens"] / wall, "rss": peak}


def library(inp: Path, tok: Path, workers: int, env: dict[str, str]) -> dict:
    lib_env = {**env, "RAYON_NUM_THREADS": str(workers), "TOKENIZERS_PARALLELISM": "true"}
    wall, peak, out = run_measured([PY, "-c", LIBRARY, str(tok), str(inp)], lib_env)
    got = json.loads(out)
    return {
        "s": got["encode_s"],
        "tokens": got["tokens"],
        "tok_s": got["tokens"] / got["encode_s"],
        "rss": peak,
    }


# -- training step time ----------------------------------------------------------------------------


def step_times(run: Path, data_args: list[str], steps: int, env: dict[str, str]) -> list[float]:
    shutil.rmtree(run, ignore_errors=True)
    cmd = [PY, "-m", "truestep", "train", "tiny", f"--run.dir={run}", f"--train.max_steps={steps}"]
    cmd += [
        "--checkpoint.interval=0",
        "--checkpoint.async_save=false",
        "--metrics.progress=false",
        *data_args,
    ]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # Wall-clock time between consecutive metrics lines: the step plus fetching its batch (the loader
    # is what a mixture changes; `step_time` alone would not see it). The first steps warm up.
    times = [m["time"] for m in lines]
    return [b - a for a, b in zip(times[3:], times[4:], strict=False)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=1.0, help="size of the generated JSONL corpus (default 1.0)")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--trials", type=int, default=3, help="trials per side for prepare-data (default 3)")
    p.add_argument("--step-trials", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--dir", type=Path, default=None, help="where to generate (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the generated corpus")
    p.add_argument("--parts", default="prep,steps", help="parts to run: prep, steps (default: both)")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="data-prep-", dir=a.dir))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        t = time.perf_counter()
        full, quarter, parquet = make_corpus(root, a.gb)
        tok = train_tokenizer(root, full)
        sizes = {
            n: f.stat().st_size / 1e9
            for n, f in (("jsonl", full), ("quarter", quarter), ("parquet", parquet))
        }
        print(
            f"corpus: {sizes} GB, tokenizer 16k BPE; generated in {time.perf_counter() - t:.0f} s; {load()}"
        )

        parts = a.parts.split(",")
        if "prep" in parts:
            sides = {
                "library": lambda: library(full, tok, a.workers, env),
                "prepare-jsonl": lambda: prepare(full, root / "out", tok, a.workers, env),
                "prepare-parquet": lambda: prepare(parquet, root / "out", tok, a.workers, env),
                "prepare-quarter": lambda: prepare(quarter, root / "out", tok, a.workers, env),
            }
            results: dict[str, list[dict]] = {name: [] for name in sides}
            for name in abba(list(sides), a.trials):
                results[name].append(sides[name]())
                r = results[name][-1]
                print(
                    f"  {name:16s} {r['s']:8.1f} s  {r['tok_s'] / 1e6:6.2f} Mtok/s  peak RSS {r['rss'] / 2**20:7.0f} MiB"
                )
            print(f"\n## Throughput ({a.workers} workers / threads, {a.gb} GB JSONL; {load()})")
            print(
                "| side | tokens | Mtok/s median [min-max] | ratio to library (median) |\n|---|---|---|---|"
            )
            lib = median([r["tok_s"] for r in results["library"]])
            for name in ("library", "prepare-jsonl", "prepare-parquet"):
                rates = [r["tok_s"] / 1e6 for r in results[name]]
                print(
                    f"| {name} | {results[name][0]['tokens']} | {spread(rates, '{:.2f}')} | {median(rates) * 1e6 / lib:.2f}x |"
                )
            print("\n## Peak RSS of prepare-data (main + workers)")
            print("| input | GB | peak RSS MiB median [min-max] |\n|---|---|---|")
            for name, gb in (("prepare-quarter", sizes["quarter"]), ("prepare-jsonl", sizes["jsonl"])):
                print(
                    f"| {name} | {gb:.2f} | {spread([r['rss'] / 2**20 for r in results[name]], '{:.0f}')} |"
                )
            ratio = median([r["rss"] for r in results["prepare-jsonl"]]) / median(
                [r["rss"] for r in results["prepare-quarter"]]
            )
            print(f"RSS ratio full/quarter: {ratio:.3f} (target <= 1.10)")

        if "steps" in parts:
            # Step time: three byte-tokenized sources (slices of the corpus) vs one.
            slices = []
            with open(full, "rb") as f:
                for k in range(3):
                    part = root / f"src{k}.jsonl"
                    part.write_bytes(b"".join(f.readline() for _ in range(2000)))
                    slices.append(part)
            dirs = []
            for k, part in enumerate(slices):
                out = root / f"mix{k}"
                subprocess.run(
                    [PY, "-m", "truestep", "prepare-data", str(part), "--out", str(out), "--no-progress"],
                    env=env,
                    check=True,
                    capture_output=True,
                )
                dirs.append(out)
            one = [f"--data.path={dirs[0]}"]
            mix = [
                f'--data.sources=[{{path="{dirs[0]}", weight=0.5}}, {{path="{dirs[1]}", weight=0.3}}, {{path="{dirs[2]}", weight=0.2}}]'
            ]
            steps: dict[str, list[float]] = {"one": [], "mixture": []}
            for name in abba(["one", "mixture"], a.step_trials):
                steps[name].append(
                    median(step_times(root / "run", one if name == "one" else mix, a.steps, env))
                )
            print(
                f"\n## Training step time, tiny preset, {a.steps} steps x {a.step_trials} trials ({load()})"
            )
            print("| data | median step s [min-max over trials] |\n|---|---|")
            for name, values in steps.items():
                print(f"| {name} | {spread(values, '{:.4f}')} |")
            print(
                f"throughput ratio mixture/one: {median(steps['one']) / median(steps['mixture']):.3f} (target >= 0.98)"
            )
    finally:
        if a.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
