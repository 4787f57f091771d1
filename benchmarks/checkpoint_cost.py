"""What a checkpoint costs the training loop: sync save vs async save vs a raw sequential write of the
same bytes, plus verify + restore, measured side by side in one process.

One in-process Trainer (single process, no process group) with a model of a few hundred MB of fp32
weights + AdamW moments (default dim 512 x 8 layers ~ 24M params ~ 290 MB of state). A few steps run
first so the AdamW state exists. Then every repeat measures, in an order rotated from repeat to repeat
so that machine noise hits every variant alike:

  sync      checkpoint.async_save=false: Checkpointer.save() returns after DCP wrote and fsynced the
            shards and rank 0 committed (manifest with the SHA-256 of every file, then the marker);
            then, on that checkpoint, with its pages evicted from the page cache:
            verify  = integrity.verify(checksums=True) as the resume resolver runs it (cold read + SHA-256),
            restore = state.restore() (dcp.load + set_{model,optimizer}_state_dict, warm after verify);
  async     Checkpointer.save() with async_save=true (staging copy + thread start: what the loop waits),
            then wait() at once: time until written and committed with nothing overlapping;
  overlap   the way the loop really runs it: save(), then training steps with Checkpointer.poll() after
            each until the commit has happened. The poll that commits runs the manifest's SHA-256 pass
            on the training thread, so it is reported as blocking too, as is the slowdown of the steps
            that overlapped the background write;
  raw       one sequential write of the same number of bytes in 64 MiB chunks + fsync (disk bandwidth).

"save() call" is timed around Checkpointer.save() (it includes the parameter digest taken before the
save); "event blocking_s" is what the checkpoint_save event reports.

    OMP_NUM_THREADS=1 python benchmarks/checkpoint_cost.py [--repeats 5] [--dim 512] [--layers 8]
        [--interval 100] [--dir /path/on/the/checkpoint/filesystem] [--section.key=value ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from truestep.checkpoint.catalog import step_dir_name
from truestep.checkpoint.integrity import verify
from truestep.checkpoint.saver import Checkpointer
from truestep.checkpoint.state import restore
from truestep.config.load import load_config
from truestep.core.status import RankStatus
from truestep.parallel.dist import init_distributed
from truestep.telemetry.digest import param_digest
from truestep.telemetry.run_logs import RunLogs
from truestep.train.trainer import Trainer

RAW_CHUNK = 64 << 20
VARIANTS = ("sync", "async", "overlap", "raw")


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def evict(path: Path) -> None:
    """Drop the (clean, fsynced) pages of every file under path from the page cache, no root needed."""
    for p in path.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def raw_write(path: Path, nbytes: int, chunk: bytes) -> float:
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, chunk[: min(left, len(chunk))])
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - started
    evict(path)
    path.unlink()
    return elapsed


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{median(values):.3f}  ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--dim", type=int, default=512, help="model.dim")
    parser.add_argument("--layers", type=int, default=8, help="model.n_layers")
    parser.add_argument("--seq-len", type=int, default=64, help="data.seq_len (small: keeps steps short)")
    parser.add_argument("--batch", type=int, default=2, help="train.global_batch_size")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of (sync, async, overlap, raw)")
    parser.add_argument("--warmup-steps", type=int, default=2, help="steps before measuring (AdamW state)")
    parser.add_argument("--steps", type=int, default=2, help="timed plain steps per repeat (step time)")
    parser.add_argument("--max-overlap-steps", type=int, default=100, help="cap on steps in `overlap`")
    parser.add_argument("--interval", type=int, default=100, help="checkpoint interval for the amortized %%")
    parser.add_argument("--dir", default=None, help="parent of the temporary run dir (default: system tmp)")
    args, overrides = parser.parse_known_args()

    with tempfile.TemporaryDirectory(prefix="truestep-ckpt-bench-", dir=args.dir) as tmp:
        run_dir = Path(tmp)
        cfg = load_config(
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
        ctx = init_distributed(cfg)
        if ctx.distributed:
            raise SystemExit("checkpoint_cost.py is a single-process benchmark; run it without torchrun")
        logs = RunLogs(Path(cfg.run.dir), 0, enabled=True)
        trainer = Trainer(cfg, ctx, logs, RankStatus())
        n_params = sum(p.numel() for p in trainer.model.parameters())
        root = Path(cfg.run.dir) / "checkpoints"
        ckpt = Checkpointer(root, cfg.checkpoint, ctx, logs, trainer.trajectory_keys, lambda: None, 0)
        captured: list[tuple[str, dict]] = []
        log_event = trainer.logs.event

        def capture(event: str, **fields: object) -> None:
            captured.append((event, fields))
            log_event(event, **fields)

        trainer.logs.event = capture  # type: ignore[method-assign]

        def field(event: str, key: str) -> float:
            return float(next(f[key] for e, f in reversed(captured) if e == event))

        def step() -> float:
            return trainer.train_step(trainer.loader.next()).step_time

        def fresh_dir() -> Path:
            """The directory the next save writes; reset so the same step can be saved again."""
            target = ckpt.root / step_dir_name(trainer.state.step)
            shutil.rmtree(target, ignore_errors=True)
            ckpt.last_saved_step = None
            return target

        for _ in range(args.warmup_steps):
            step()

        res: dict[str, list[float]] = {
            k: []
            for k in (
                "step",
                "sync",
                "sync_event_blocking",
                "sync_commit",
                "verify",
                "restore",
                "async_call",
                "async_event_blocking",
                "async_total",
                "async_commit",
                "ov_call",
                "ov_commit_poll",
                "ov_total",
                "ov_steps",
                "ov_slowdown",
                "raw",
                "digest",
            )
        }
        nbytes = 0
        chunk = os.urandom(RAW_CHUNK)

        def run_sync() -> None:
            nonlocal nbytes
            target = fresh_dir()
            cfg.checkpoint.async_save = False
            started = time.perf_counter()
            ckpt.save(trainer.state.step, trainer, "bench", lambda: param_digest(trainer.model, ctx))
            res["sync"].append(time.perf_counter() - started)
            res["sync_event_blocking"].append(field("checkpoint_save", "blocking_s"))
            res["sync_commit"].append(field("checkpoint_commit", "commit_s"))
            nbytes = dir_bytes(target)
            evict(target)
            started = time.perf_counter()
            verify(target, checksums=True)
            res["verify"].append(time.perf_counter() - started)
            started = time.perf_counter()
            restore(trainer, target, cfg.checkpoint, ctx, trainer.trajectory_keys, logs)
            res["restore"].append(time.perf_counter() - started)
            shutil.rmtree(target)

        def run_async() -> None:
            target = fresh_dir()
            cfg.checkpoint.async_save = True
            started = time.perf_counter()
            ckpt.save(trainer.state.step, trainer, "bench", lambda: param_digest(trainer.model, ctx))
            res["async_call"].append(time.perf_counter() - started)
            ckpt.wait()
            res["async_total"].append(time.perf_counter() - started)
            res["async_event_blocking"].append(field("checkpoint_save", "blocking_s"))
            res["async_commit"].append(field("checkpoint_commit", "commit_s"))
            shutil.rmtree(target)

        def run_overlap() -> None:
            target = fresh_dir()
            cfg.checkpoint.async_save = True
            base = median(res["step"])
            started = time.perf_counter()
            ckpt.save(trainer.state.step, trainer, "bench", lambda: param_digest(trainer.model, ctx))
            res["ov_call"].append(time.perf_counter() - started)
            slowdown, steps, commit_poll = 0.0, 0, 0.0
            while ckpt.pending is not None and steps < args.max_overlap_steps:
                slowdown += step() - base
                steps += 1
                polled = time.perf_counter()
                ckpt.poll()
                if ckpt.pending is None:
                    commit_poll = time.perf_counter() - polled
            if ckpt.pending is not None:  # still not written after the cap: finish it, blocking
                polled = time.perf_counter()
                ckpt.wait()
                commit_poll = time.perf_counter() - polled
            ckpt.wait()  # the commit runs on rank 0's background thread: committed = that thread done
            res["ov_total"].append(time.perf_counter() - started)
            res["ov_commit_poll"].append(commit_poll)
            res["ov_steps"].append(steps)
            res["ov_slowdown"].append(slowdown)
            shutil.rmtree(target)

        def run_raw() -> None:
            res["raw"].append(raw_write(run_dir / "raw.bin", nbytes, chunk))

        run = {"sync": run_sync, "async": run_async, "overlap": run_overlap, "raw": run_raw}
        run_sync()  # warm-up: sizes the raw write, first-touch allocations; not measured
        for values in res.values():
            values.clear()
        for _ in range(args.steps):
            res["step"].append(step())
        for repeat in range(args.repeats):
            order = VARIANTS[repeat % len(VARIANTS) :] + VARIANTS[: repeat % len(VARIANTS)]
            for name in order:
                run[name]()
            for _ in range(args.steps):
                res["step"].append(step())
            started = time.perf_counter()
            param_digest(trainer.model, ctx)
            res["digest"].append(time.perf_counter() - started)
        trainer.logs.close()

    m = {k: median(v) for k, v in res.items()}
    step_s, mb = m["step"], nbytes / 1e6
    ov_blocking = m["ov_call"] + m["ov_commit_poll"]
    ov_cost = ov_blocking + m["ov_slowdown"]
    print(
        f"model dim={args.dim} layers={args.layers}: {n_params / 1e6:.1f}M params; checkpoint "
        f"{mb:,.0f} MB on disk; step {step_s:.3f} s (seq {args.seq_len} x batch {args.batch}); "
        f"{args.repeats} repeats, medians (min-max) in seconds"
    )
    rows = [
        ("step (no checkpoint)", res["step"]),
        ("param_digest (inside every save())", res["digest"]),
        ("sync save() total", res["sync"]),
        ("  event blocking_s (DCP write)", res["sync_event_blocking"]),
        ("  event commit_s (SHA-256 + marker)", res["sync_commit"]),
        ("async save() call (loop waits)", res["async_call"]),
        ("  event blocking_s", res["async_event_blocking"]),
        ("async save() + wait(): committed", res["async_total"]),
        ("  event commit_s", res["async_commit"]),
        ("overlap: save() call", res["ov_call"]),
        ("overlap: poll() that commits", res["ov_commit_poll"]),
        ("overlap: save() -> committed", res["ov_total"]),
        ("overlap: steps overlapped", res["ov_steps"]),
        ("overlap: extra step time, summed", res["ov_slowdown"]),
        ("raw write + fsync, same bytes", res["raw"]),
        ("verify (cold cache, SHA-256)", res["verify"]),
        ("restore (dcp.load + set state)", res["restore"]),
    ]
    width = max(len(name) for name, _ in rows)
    for name, values in rows:
        print(f"  {name:<{width}}  {spread(values)}")
    print(f"raw write bandwidth {mb / m['raw']:,.0f} MB/s; sync save {mb / m['sync']:,.0f} MB/s effective")
    print("ratios:")
    print(f"  sync / raw write                       {m['sync'] / m['raw']:.2f}")
    print(f"  async committed / raw write            {m['async_total'] / m['raw']:.2f}")
    print(f"  async save() call / sync               {m['async_call'] / m['sync']:.3f}")
    print(
        f"  overlap loop blocking / sync           {ov_blocking / m['sync']:.3f}  (save() call + commit poll)"
    )
    print(
        f"  overlap loop cost / sync               {ov_cost / m['sync']:.3f}  (+ slowdown of overlapped steps)"
    )
    print(f"  (verify + restore) / sync save         {(m['verify'] + m['restore']) / m['sync']:.2f}")
    print(f"amortized blocking at one save every {args.interval} steps of {step_s:.3f} s:")
    work = args.interval * step_s
    for name, blocking in (
        ("sync save", m["sync"]),
        ("async, save() call only", m["async_call"]),
        ("async, save() call + commit poll", ov_blocking),
        ("async, + overlapped-step slowdown", ov_cost),
    ):
        print(f"  {name:<36} {100 * blocking / (work + blocking):6.2f} %")


if __name__ == "__main__":
    main()
