"""What a checkpoint costs the training loop: sync save vs async save vs a raw sequential write of the
same bytes, plus verify + restore, measured side by side in one process.

One in-process Trainer (single process, no process group) with a model of a few hundred MB of fp32
weights + AdamW moments (default dim 512 x 8 layers ~ 24M params ~ 290 MB of state). A few steps run
first so the AdamW state exists. Then every repeat measures the four variants below, in an order that
is rotated and reversed from repeat to repeat (ABCD DCBA BCDA ADCB ...), so that machine noise and
drift hit every variant alike; each variant ends only when its checkpoint is committed, so nothing of
one variant runs during the next:

  sync      checkpoint.async_save=false: Checkpointer.save() returns after DCP wrote and fsynced the
            shards and rank 0 committed (manifest with the SHA-256 of every file, then the marker);
            then, on that checkpoint, with its pages evicted from the page cache:
            verify  = integrity.verify(checksums=True) as the resume resolver runs it (cold read + SHA-256),
            restore = state.restore() (dcp.load + set_{model,optimizer}_state_dict, warm after verify);
  async     Checkpointer.save() with async_save=true (staging copy + thread start: what the loop waits),
            then wait() at once: time until written and committed with nothing overlapping;
  overlap   the way the loop really runs it: save(), then training steps with Checkpointer.poll() after
            each until the commit is done — the background write first, then the commit's SHA-256 pass
            on rank 0's background thread: both compete with the steps, and the steps' extra time is
            charged to the save, as is every poll;
  raw       one sequential write of the same number of bytes in 64 MiB chunks + fsync (disk bandwidth).

"save() call" is timed around Checkpointer.save() (it includes the parameter digest taken before the
save); "event ..." values are read back from the run's events.jsonl, as any tool would.

    OMP_NUM_THREADS=1 python benchmarks/checkpoint_cost.py [--repeats 5] [--dim 512] [--layers 8]
        [--interval 100] [--dir /path/on/the/checkpoint/filesystem] [--section.key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from bench_common import abba, load, median, spread
from torch.distributed.checkpoint import FileSystemReader

from truestep.checkpoint.catalog import step_dir_name
from truestep.checkpoint.integrity import verify
from truestep.checkpoint.mechanisms import choose
from truestep.checkpoint.restore import restore_from_disk
from truestep.checkpoint.safe_dcp import single_process
from truestep.checkpoint.saver import Checkpointer
from truestep.config.load import load_config
from truestep.core.status import RankStatus
from truestep.parallel.dist import init_distributed
from truestep.telemetry.digest import local_digest, param_digest
from truestep.telemetry.run_logs import RunLogs
from truestep.train.trainer import Trainer

RAW_CHUNK = 64 << 20
# DCP says so at every save and load of a single process, which is what this benchmark is.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")
VARIANTS = ("sync", "async", "overlap", "raw")


class EventTail:
    """The records appended to an events.jsonl since the last look (whole lines only)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.seen = path, 0, []

    def last(self, event: str, since: float = 0.0) -> dict[str, Any] | None:
        """The newest `event` record written at or after wall-clock `since`."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        self.seen += [json.loads(line) for line in complete.splitlines() if line.strip()]
        found = [r for r in self.seen if r["event"] == event and r["time"] >= since]
        return found[-1] if found else None

    def value(self, event: str, key: str) -> float:
        record = self.last(event)
        if record is None:
            raise KeyError(f"no {event} event in {self.path}")
        return float(record[key])


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def evict(path: Path) -> None:
    """Drop the (clean, fsynced) pages of every file under path from the page cache, no root needed."""
    for p in [path] if path.is_file() else path.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class Bench:
    """One Trainer and Checkpointer; each `run_*` measures one variant once into `res`."""

    def __init__(self, args: argparse.Namespace, overrides: list[str], run_dir: Path) -> None:
        self.args, self.run_dir = args, run_dir
        self.cfg = load_config(
            args.preset,
            [
                f"--run.dir={run_dir}",
                f"--model.dim={args.dim}",
                f"--model.n_layers={args.layers}",
                f"--model.max_seq_len={args.seq_len}",
                f"--data.seq_len={args.seq_len}",
                f"--train.global_batch_size={args.batch}",
                "--train.max_steps=100000",
                "--checkpoint.keep_last_n=0",
                "--metrics.progress=false",
                *overrides,
            ],
        )
        self.ctx = init_distributed(self.cfg)
        if self.ctx.distributed:
            raise SystemExit("checkpoint_cost.py is a single-process benchmark; run it without torchrun")
        self.logs = RunLogs(run_dir, 0, enabled=True)
        self.events = EventTail(self.logs.run_dir / "events.jsonl")
        self.trainer = Trainer(self.cfg, self.ctx, self.logs, RankStatus())
        self.trainer.initialize()  # a fresh start (the Trainer only allocates)
        self.ckpt = Checkpointer(
            run_dir / "checkpoints", self.cfg.checkpoint, self.ctx, self.logs, self.trainer.trajectory_keys,
            lambda: None, 0,
        )  # fmt: skip
        self.res: dict[str, list[float]] = defaultdict(list)
        self.nbytes = 0
        self.chunk = os.urandom(RAW_CHUNK)

    def step(self) -> float:
        return self.trainer.train_step(self.trainer.loader.next()).step_time

    def save(self, async_save: bool) -> tuple[Path, float]:
        """Save the current step afresh; (its directory, the time the call blocked)."""
        target = self.ckpt.root / step_dir_name(self.trainer.state.step)
        shutil.rmtree(target, ignore_errors=True)
        self.ckpt.last_saved_step = None  # so the same step can be saved again
        self.cfg.checkpoint.async_save = async_save
        self.ckpt.mechanisms = choose(self.cfg.checkpoint)  # the writer follows the switch just set
        digest = lambda: local_digest(self.trainer.model)  # noqa: E731 - inside save()'s timing
        started = time.perf_counter()
        self.ckpt.save(self.trainer.state.step, self.trainer, "bench", digest)
        return target, time.perf_counter() - started

    def run_sync(self) -> None:
        target, took = self.save(async_save=False)
        self.res["sync"].append(took)
        self.res["sync_event_blocking"].append(self.events.value("checkpoint_save", "blocking_s"))
        self.res["sync_commit"].append(self.events.value("checkpoint_commit", "commit_s"))
        self.nbytes = dir_bytes(target)
        # The resume, as the resolver and the restore run it, cold: structural checks, then the load
        # that hashes each item as it reads it; and a stock dcp.load of the same files, cold too, in
        # an order that alternates from repeat to repeat.
        sides = [self.resume_side, self.plain_load_side]
        for side in sides if len(self.res["verify"]) % 2 == 0 else sides[::-1]:
            evict(target)
            side(target)
        shutil.rmtree(target)

    def resume_side(self, target: Path) -> None:
        started = time.perf_counter()
        verify(target, checksums=True, items_on_read=True)
        self.res["verify"].append(time.perf_counter() - started)
        started = time.perf_counter()
        restore_from_disk(
            self.trainer, target, self.cfg.checkpoint, self.ctx, self.trainer.trajectory_keys, self.logs,
            choose(self.cfg.checkpoint),
        )  # fmt: skip
        self.res["restore"].append(time.perf_counter() - started)

    def plain_load_side(self, target: Path) -> None:
        state = self.trainer.dcp_state_dict(with_optimizer=True)
        started = time.perf_counter()
        with single_process():
            dcp.load(state, storage_reader=FileSystemReader(target), no_dist=True)
        self.res["plain_load"].append(time.perf_counter() - started)

    def run_async(self) -> None:
        started = time.perf_counter()
        target, took = self.save(async_save=True)
        self.res["async_call"].append(took)
        self.ckpt.wait()
        self.res["async_total"].append(time.perf_counter() - started)
        self.res["async_event_blocking"].append(self.events.value("checkpoint_save", "blocking_s"))
        self.res["async_commit"].append(self.events.value("checkpoint_commit", "commit_s"))
        shutil.rmtree(target)

    def run_overlap(self) -> None:
        base = median(self.res["step"])
        started, since = time.perf_counter(), time.time()
        target, took = self.save(async_save=True)
        polls = slowdown = 0.0
        steps = 0
        while self.events.last("checkpoint_commit", since) is None and steps < self.args.max_overlap_steps:
            slowdown += self.step() - base
            steps += 1
            polled = time.perf_counter()
            self.ckpt.poll()  # hands the commit to rank 0's thread once the write is done
            polls += time.perf_counter() - polled
        waited = time.perf_counter()
        self.ckpt.wait()  # only after the cap: a commit not done by then is finished blocking
        polls += time.perf_counter() - waited
        self.res["ov_total"].append(time.perf_counter() - started)
        self.res["ov_call"].append(took)
        self.res["ov_polls"].append(polls)
        self.res["ov_steps"].append(steps)
        self.res["ov_slowdown"].append(slowdown)
        self.res["ov_cost"].append(took + polls + slowdown)
        shutil.rmtree(target)

    def run_raw(self) -> None:
        path = self.run_dir / "raw.bin"
        started = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = self.nbytes
            while left > 0:
                left -= os.write(fd, self.chunk[: min(left, len(self.chunk))])
            os.fsync(fd)
        finally:
            os.close(fd)
        self.res["raw"].append(time.perf_counter() - started)
        evict(path)
        path.unlink()

    def measure(self) -> None:
        for _ in range(self.args.warmup_steps):
            self.step()
        self.run_sync()  # warm-up: sizes the raw write, first-touch allocations; not measured
        self.res.clear()
        for _ in range(self.args.steps):
            self.res["step"].append(self.step())
        run = {
            "sync": self.run_sync,
            "async": self.run_async,
            "overlap": self.run_overlap,
            "raw": self.run_raw,
        }
        order = abba(VARIANTS, self.args.repeats)
        for repeat in range(self.args.repeats):
            for name in order[repeat * len(VARIANTS) : (repeat + 1) * len(VARIANTS)]:
                run[name]()
            for _ in range(self.args.steps):
                self.res["step"].append(self.step())
            started = time.perf_counter()
            param_digest(self.trainer.model, self.ctx)
            self.res["digest"].append(time.perf_counter() - started)
        self.logs.close()


def report(bench: Bench) -> None:
    args, res = bench.args, bench.res
    n_params = sum(p.numel() for p in bench.trainer.model.parameters())
    m = {k: median(v) for k, v in res.items()}
    step_s, mb = m["step"], bench.nbytes / 1e6
    ov_blocking = m["ov_call"] + m["ov_polls"]
    print(
        f"model dim={args.dim} layers={args.layers}: {n_params / 1e6:.1f}M params; checkpoint {mb:,.0f} MB "
        f"on disk; step {step_s:.3f} s (seq {args.seq_len} x batch {args.batch}); {args.repeats} repeats "
        f"in ABBA order; seconds, median [min-max]"
    )
    rows = [
        ("step (no checkpoint)", "step"),
        ("param_digest (inside every save())", "digest"),
        ("sync save() total", "sync"),
        ("  event blocking_s", "sync_event_blocking"),
        ("  event commit_s (SHA-256 + marker)", "sync_commit"),
        ("async save() call (loop waits)", "async_call"),
        ("  event blocking_s", "async_event_blocking"),
        ("async save() + wait(): committed", "async_total"),
        ("  event commit_s", "async_commit"),
        ("overlap: save() call", "ov_call"),
        ("overlap: every poll(), summed", "ov_polls"),
        ("overlap: steps until committed", "ov_steps"),
        ("overlap: extra step time, summed", "ov_slowdown"),
        ("overlap: loop cost (call+polls+extra)", "ov_cost"),
        ("overlap: save() -> committed", "ov_total"),
        ("raw write + fsync, same bytes", "raw"),
        ("resume: verify (structural, cold)", "verify"),
        ("resume: restore (hashing load + set state)", "restore"),
        ("plain stock dcp.load, same files, cold", "plain_load"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, key in rows:
        print(f"  {name:<{width}}  {spread(res[key])}")
    print(f"raw write bandwidth {mb / m['raw']:,.0f} MB/s; sync save {mb / m['sync']:,.0f} MB/s effective")
    print("ratios of medians:")
    for name, value in (
        ("sync / raw write", m["sync"] / m["raw"]),
        ("async committed / raw write", m["async_total"] / m["raw"]),
        ("async save() call / sync", m["async_call"] / m["sync"]),
        ("overlap loop blocking / sync  (call + polls)", ov_blocking / m["sync"]),
        ("overlap loop cost / sync  (+ extra step time until committed)", m["ov_cost"] / m["sync"]),
        ("(verify + restore) / sync save", (m["verify"] + m["restore"]) / m["sync"]),
        ("resume (verify + restore) / plain dcp.load", (m["verify"] + m["restore"]) / m["plain_load"]),
    ):
        print(f"  {name:<62} {value:.3f}")
    print(f"amortized cost at one save every {args.interval} steps of {step_s:.3f} s:")
    work = args.interval * step_s
    for name, blocking in (
        ("sync save", m["sync"]),
        ("async, save() call only", m["async_call"]),
        ("async, save() call + polls", ov_blocking),
        ("async, + overlapped-step slowdown until committed", m["ov_cost"]),
    ):
        print(f"  {name:<52} {100 * blocking / (work + blocking):6.2f} %")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--dim", type=int, default=512, help="model.dim")
    parser.add_argument("--layers", type=int, default=8, help="model.n_layers")
    parser.add_argument("--seq-len", type=int, default=64, help="data.seq_len (small: keeps steps short)")
    parser.add_argument("--batch", type=int, default=2, help="train.global_batch_size")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of (sync, async, overlap, raw), >= 5")
    parser.add_argument("--warmup-steps", type=int, default=2, help="steps before measuring (AdamW state)")
    parser.add_argument("--steps", type=int, default=2, help="timed plain steps per repeat (step time)")
    parser.add_argument("--max-overlap-steps", type=int, default=200, help="cap on steps in `overlap`")
    parser.add_argument("--interval", type=int, default=100, help="checkpoint interval for the amortized %%")
    parser.add_argument("--dir", default=None, help="parent of the temporary run dir (default: system tmp)")
    parser.add_argument("--json", default=None, help="also write every trial's seconds here (for sweeps)")
    args, overrides = parser.parse_known_args()
    print(load(), flush=True)
    with tempfile.TemporaryDirectory(prefix="truestep-ckpt-bench-", dir=args.dir) as tmp:
        bench = Bench(args, overrides, Path(tmp))
        bench.measure()
    report(bench)
    if args.json:
        n_params = sum(p.numel() for p in bench.trainer.model.parameters())
        record = {"dim": args.dim, "layers": args.layers, "params": n_params, "bytes": bench.nbytes}
        Path(args.json).write_text(json.dumps({**record, "trials": dict(bench.res)}, indent=1))
    print(load())


if __name__ == "__main__":
    main()
