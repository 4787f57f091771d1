"""Tokens/s of truestep's training step (with its hooks) vs a bare hand-written PyTorch loop.

Same model, same data, same layout; blocks of steps alternate between the two in one process so that
machine noise hits both alike. Prints the median tokens/s of each and their ratio (target >= 0.97).

    python benchmarks/step_overhead.py [--preset tiny] [--blocks 6] [--steps 10]
    torchrun --standalone --nproc-per-node=2 benchmarks/step_overhead.py     # FSDP x2 (bare: fully_shard)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from truestep.config.load import load_config
from truestep.core.status import RankStatus
from truestep.model.llama import Transformer
from truestep.parallel.dist import init_distributed, shutdown
from truestep.resilience.attempt import Attempt
from truestep.telemetry.run_logs import RunLogs
from truestep.train.run import build_hooks
from truestep.train.schedule import lr_at
from truestep.train.trainer import Trainer


def bare_setup(cfg, ctx):
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


def bare_step(model, opt, batches, step, cfg) -> float:
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg)
    for inputs, targets in batches:
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()) / len(batches)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--blocks", type=int, default=6, help="alternating blocks per side")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    args, overrides = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as run_dir:
        total = 2 * args.blocks * args.steps + 10
        cfg = load_config(
            args.preset,
            [f"--run.dir={run_dir}", f"--train.max_steps={total}", "--metrics.progress=false", *overrides],
        )
        ctx = init_distributed(cfg)
        if ctx.tp > 1:
            raise SystemExit("step_overhead.py compares against a bare FSDP loop; use parallel.tp=1")
        logs = RunLogs(Path(run_dir), 0, enabled=ctx.is_main)
        trainer = Trainer(cfg, ctx, logs, RankStatus())
        hooks = build_hooks(Attempt(0, "bench", lambda: None))
        for hook in hooks:
            hook.on_start(trainer)
        model, opt = bare_setup(cfg, ctx)
        tokens = cfg.train.global_batch_size * cfg.data.seq_len

        def truestep_block() -> float:
            start = time.perf_counter()
            for _ in range(args.steps):
                result = trainer.train_step(trainer.loader.next())
                for hook in hooks:
                    hook.after_step(trainer, result)
            return args.steps * tokens / (time.perf_counter() - start)

        bare_batch = 0

        def bare_block() -> float:
            nonlocal bare_batch
            start = time.perf_counter()
            for _ in range(args.steps):
                bare_step(model, opt, trainer.loader.batch_for(bare_batch), bare_batch, cfg)
                bare_batch += 1
            return args.steps * tokens / (time.perf_counter() - start)

        truestep_block(), bare_block()  # warm-up, not measured
        ours, bare = [], []
        for _ in range(args.blocks):
            ours.append(truestep_block())
            bare.append(bare_block())
        if ctx.is_main:
            med_ours, med_bare = statistics.median(ours), statistics.median(bare)
            print(f"layout {ctx.layout()}  preset {args.preset}  {args.blocks} x {args.steps} steps per side")
            print(f"truestep  {med_ours:12,.0f} tokens/s  ({tokens / med_ours * 1e3:.1f} ms/step)")
            print(f"bare loop {med_bare:12,.0f} tokens/s  ({tokens / med_bare * 1e3:.1f} ms/step)")
            print(f"ratio truestep/bare = {med_ours / med_bare:.3f}  (target >= 0.97)")
        trainer.logs.close()
        if ctx.distributed:
            dist.barrier()
        shutdown(ctx)


if __name__ == "__main__":
    main()
