"""Step time with in-memory snapshots every k steps vs none, side by side in one process pair (run under
torchrun by memory_recovery.py's `steady` part; usable alone):

    torchrun --standalone --nproc-per-node=2 benchmarks/memory_steady.py [--rounds 5] [--steps 40]
        --resilience.snapshot_dir=/dev/shm/x [--model.dim=768 --model.n_layers=13]

Sides `off`, `k=1`, `k=2`, `k=5`, `k=10` run in blocks of `--steps` steps (a multiple of 10, so that every
side snapshots the same number of times per block at any phase), one unmeasured warm-up block each, then
`--rounds` blocks each in counterbalanced order. A block is the real training step with every hook of
`truestep train` plus the snapshot hook's work (the optimizer waits for the copy of the state it changes,
the copy goes to the buddy in the background, the ranks agree at the next boundary); it ends once its
last snapshot is agreed, so no copy of one side runs during another's block. Prints ms/step per side,
median [min-max], and the ratio to `off`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist
from bench_common import abba, load, median, spread

from truestep.checkpoint.mechanisms import choose
from truestep.checkpoint.saver import Checkpointer
from truestep.config.load import load_config
from truestep.config.schema import JobConfig
from truestep.core.status import RankStatus
from truestep.parallel.dist import DistContext, init_distributed, shutdown
from truestep.telemetry.run_logs import RunLogs
from truestep.telemetry.tensorboard import TensorBoardSink
from truestep.train.loop import in_order
from truestep.train.memory import MemoryPath
from truestep.train.restorer import Restorer
from truestep.train.run import build_hooks
from truestep.train.trainer import Trainer
from truestep.train.view import StepView

SIDES = {"off": 0, "k=1": 1, "k=2": 2, "k=5": 5, "k=10": 10}


def make_blocks(cfg: JobConfig, ctx: DistContext, run_dir: Path, steps: int) -> tuple[Callable, MemoryPath]:
    logs = RunLogs(run_dir, 0, enabled=ctx.is_main)
    trainer = Trainer(cfg, ctx, logs, RankStatus())
    mechanisms = choose(cfg.checkpoint)
    checkpointer = Checkpointer(
        run_dir / "checkpoints",
        cfg.checkpoint,
        ctx,
        logs,
        trainer.trajectory_keys,
        lambda: None,
        0,
        "",
        mechanisms,
    )
    hooks = in_order(build_hooks(checkpointer, TensorBoardSink(run_dir / "tb", False)))
    start = Restorer(trainer, checkpointer, mechanisms).start()
    view = StepView(trainer)
    for hook in hooks:
        hook.on_start(view, start)
    memory = MemoryPath(trainer, "steady-bench", ctx.world_size)  # budget checked and logged, as in a run
    snapshots = memory.start_snapshots()
    view.before_optimizer_step(snapshots.wait_captured)

    def block(k: int) -> float:
        began = time.perf_counter()
        for _ in range(steps):
            result = trainer.train_step(trainer.loader.next())
            for hook in hooks:
                hook.after_step(view, result)
            if k:
                snapshots.every = k
                snapshots.after_step(trainer.state.step)
        snapshots.agree()  # this block's last snapshot is charged to it
        return (time.perf_counter() - began) / steps

    return block, memory


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    args, overrides = parser.parse_known_args()
    if args.steps % 10 or args.rounds < 1:
        parser.error("--steps must be a multiple of 10 and --rounds >= 1")
    with tempfile.TemporaryDirectory() as run_dir:
        total = len(SIDES) * (args.rounds + 1) * args.steps + 1
        cfg = load_config(
            args.preset,
            [
                f"--run.dir={run_dir}",
                f"--train.max_steps={total}",
                "--checkpoint.interval=0",
                "--metrics.progress=false",
                "--resilience.snapshot_every_steps=1",
                *overrides,
            ],
        )
        ctx = init_distributed(cfg)
        block, memory = make_blocks(cfg, ctx, Path(run_dir), args.steps)
        try:
            for k in SIDES.values():
                block(k)  # warm-up, not measured
            got: dict[str, list[float]] = {side: [] for side in SIDES}
            for side in abba(list(SIDES), args.rounds):
                got[side].append(block(SIDES[side]))
        finally:
            memory.release()
        if ctx.is_main:
            state = memory.budget.state_bytes * ctx.world_size / 1e9
            print(f"  state {state:.2f} GB ({memory.budget.state_bytes / 1e9:.2f} GB per rank); {load()}")
            base = median(got["off"])
            for side in SIDES:
                ms = [1e3 * v for v in got[side]]
                print(
                    f"  {side:<5} {spread(ms, '{:.1f}'):<28} ms/step   x{median(got[side]) / base:.3f} of off"
                )
        if ctx.distributed:
            dist.barrier()
        shutdown(ctx)


if __name__ == "__main__":
    main()
