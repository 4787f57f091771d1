"""Tokens/s of truestep's training step (with its hooks) vs a bare hand-written PyTorch loop, and the
cost of determinism, side by side in one process.

Same model, same data, same layout. Three sides run in blocks of `--steps` steps, in a counterbalanced
order (each round reversed from the previous one, the starting side rotated: ABC CBA BCA ACB ...),
after one unmeasured warm-up block each:

  truestep       Trainer.train_step + every hook of `truestep train` (checkpoint policy, collective
                 timeouts, metrics, NaN guard, signals), `torch.use_deterministic_algorithms` as the
                 config says (train.deterministic, default on);
  bare           the hand-written loop, deterministic algorithms exactly as truestep runs them: the
                 like-for-like comparison, truestep/bare is truestep's own overhead;
  bare-nondet    the same loop with deterministic algorithms off: bare-nondet/bare is the cost of
                 determinism (a separate line, not hidden in either side).

Checkpoints are excluded by default (checkpoint.interval=0 here; what a save costs is
checkpoint_cost.py's job). With `--checkpoint.interval=N` the truestep side saves every N steps and
each of its blocks ends waiting until its save is committed, inside its own timing, so that no write
runs during another side's block. Prints min/median/max tokens/s per side and the ratios of medians.

    python benchmarks/step_overhead.py [--preset tiny] [--rounds 6] [--steps 10]
    torchrun --standalone --nproc-per-node=2 benchmarks/step_overhead.py     # FSDP x2 (bare: fully_shard)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from bench_common import abba, load, median, spread
from torch.distributed.fsdp import fully_shard

from truestep.checkpoint.mechanisms import choose
from truestep.checkpoint.saver import Checkpointer
from truestep.config.load import load_config
from truestep.config.schema import JobConfig
from truestep.core.status import RankStatus
from truestep.model.llama import Transformer
from truestep.parallel.dist import DistContext, init_distributed, shutdown
from truestep.telemetry.run_logs import RunLogs
from truestep.telemetry.tensorboard import ScalarSinks
from truestep.train.loop import in_order
from truestep.train.restorer import Restorer
from truestep.train.run import build_hooks
from truestep.train.schedule import lr_at
from truestep.train.trainer import Trainer
from truestep.train.view import StepView

SIDES = ("truestep", "bare", "bare-nondet")


def bare_setup(cfg: JobConfig, ctx: DistContext) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """What a user would write by hand: build, init, shard per block + root, AdamW."""
    model = Transformer(cfg.model)
    model.init_weights(cfg.train.seed)
    if ctx.distributed:
        for block in model.layers.values():
            fully_shard(block)
        fully_shard(model)
    o = cfg.optim
    opt = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
    )
    return model, opt


def bare_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list, step: int, cfg: JobConfig
) -> None:
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg)
    for inputs, targets in batches:
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()) / len(batches)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()


def make_sides(cfg: JobConfig, ctx: DistContext, run_dir: Path, steps: int) -> dict[str, Callable[[], float]]:
    """side -> a function that runs one block and returns its tokens/s."""
    logs = RunLogs(run_dir, 0, enabled=ctx.is_main)
    trainer = Trainer(cfg, ctx, logs, RankStatus())  # sets deterministic algorithms as configured
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
    hooks = in_order(build_hooks(checkpointer, ScalarSinks(None)))
    start = Restorer(trainer, checkpointer, mechanisms).start()
    view = StepView(trainer)
    for hook in hooks:
        hook.on_start(view, start)
    model, opt = bare_setup(cfg, ctx)
    tokens = cfg.train.global_batch_size * cfg.data.seq_len
    bare_batch = 0

    def truestep_block() -> float:
        torch.use_deterministic_algorithms(cfg.train.deterministic)
        start = time.perf_counter()
        for _ in range(steps):
            result = trainer.train_step(trainer.loader.next())
            for hook in hooks:
                hook.after_step(view, result)
        checkpointer.wait()  # a save made here is charged here (no-op without saves)
        return steps * tokens / (time.perf_counter() - start)

    def bare_block(deterministic: bool) -> float:
        nonlocal bare_batch
        torch.use_deterministic_algorithms(deterministic)
        start = time.perf_counter()
        for _ in range(steps):
            bare_step(model, opt, trainer.loader.batch_for(bare_batch), bare_batch, cfg)
            bare_batch += 1
        return steps * tokens / (time.perf_counter() - start)

    return {
        "truestep": truestep_block,
        "bare": lambda: bare_block(cfg.train.deterministic),
        "bare-nondet": lambda: bare_block(False),
    }


def report(cfg: JobConfig, ctx: DistContext, args: argparse.Namespace, got: dict[str, list[float]]) -> None:
    tokens = cfg.train.global_batch_size * cfg.data.seq_len
    saves = (
        f"a save every {cfg.checkpoint.interval} steps, charged to truestep"
        if cfg.checkpoint.interval
        else "none"
    )
    print(
        f"layout {ctx.layout()}  preset {args.preset}  {args.rounds} blocks x {args.steps} steps per side, "
        f"order {' '.join(abba(SIDES, 2))} ...; deterministic={cfg.train.deterministic}; saves: {saves}"
    )
    for side in SIDES:
        ms = [tokens / v * 1e3 for v in got[side]]
        print(f"  {side:<12} {spread(got[side], '{:,.0f}')} tokens/s   ({spread(ms, '{:.1f}')} ms/step)")
    m = {side: median(values) for side, values in got.items()}
    print(
        f"ratio truestep / bare                 = {m['truestep'] / m['bare']:.3f}  (truestep's overhead; target >= 0.97)"
    )
    print(
        f"ratio bare-nondet / bare              = {m['bare-nondet'] / m['bare']:.3f}  (the cost of determinism)"
    )
    print(f"ratio truestep / bare-nondet          = {m['truestep'] / m['bare-nondet']:.3f}  (both together)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--rounds", type=int, default=6, help="measured blocks per side (>= 5)")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    args, overrides = parser.parse_known_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be >= 1")
    with tempfile.TemporaryDirectory() as run_dir:
        total = (len(SIDES) * (args.rounds + 1) + 1) * args.steps
        cfg = load_config(
            args.preset,
            [
                f"--run.dir={run_dir}",
                f"--train.max_steps={total}",
                "--checkpoint.interval=0",
                "--metrics.progress=false",
                *overrides,
            ],
        )
        ctx = init_distributed(cfg)
        if ctx.tp > 1:
            raise SystemExit("step_overhead.py compares against a bare FSDP loop; use parallel.tp=1")
        if ctx.is_main:
            print(load())
        sides = make_sides(cfg, ctx, Path(run_dir), args.steps)
        for side in SIDES:
            sides[side]()  # warm-up, not measured
        got: dict[str, list[float]] = {side: [] for side in SIDES}
        for side in abba(SIDES, args.rounds):
            got[side].append(sides[side]())
        if ctx.is_main:
            report(cfg, ctx, args, got)
            print(load())
        if ctx.distributed:
            dist.barrier()
        shutdown(ctx)


if __name__ == "__main__":
    main()
