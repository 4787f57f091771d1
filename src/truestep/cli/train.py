"""`truestep train [CONFIG] [--section.key=value ...]`: wire the rooms together and run the loop."""

from __future__ import annotations

import argparse

from truestep.checkpoint.hook import CheckpointHook
from truestep.config.load import load_config
from truestep.config.schema import JobConfig
from truestep.faults.hooks import arm, armed
from truestep.faults.spec import parse_faults
from truestep.parallel.dist import init_distributed, shutdown
from truestep.resilience.heartbeat import HeartbeatHook
from truestep.resilience.nan_guard import NanGuardHook
from truestep.resilience.signals import SignalHook
from truestep.resilience.timeouts import CollectiveTimeoutHook
from truestep.telemetry.hook import MetricsHook
from truestep.train.loop import Hook, train_loop
from truestep.train.trainer import Trainer


def build_hooks() -> list[Hook]:
    """In call order. Checkpoint first: its on_start restores the state the others then report."""
    checkpoints = CheckpointHook()
    return [
        checkpoints,
        HeartbeatHook(),
        CollectiveTimeoutHook(),
        MetricsHook(),
        NanGuardHook(checkpoints),
        SignalHook(),
    ]


def exit_code(cfg: JobConfig, stop_reason: str | None) -> int:
    return cfg.resilience.requeue_exit_code if stop_reason == "preempted" else 0


def train_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="truestep train",
        description="Train (or resume) a run. Launch with `truestep launch` or torchrun for several processes.",
    )
    parser.add_argument("config", nargs="?", default="tiny", help="TOML file or preset name (default: tiny)")
    parser.add_argument(
        "--fault", action="append", default=[], help="fault spec (repeatable); see docs/faults.md"
    )
    args, overrides = parser.parse_known_args(argv)
    cfg = load_config(args.config, overrides)
    if args.fault:
        arm([*armed(), *parse_faults(";".join(args.fault))])
    ctx = init_distributed(cfg)
    trainer = Trainer(cfg, ctx)
    try:
        train_loop(trainer, build_hooks())
    finally:
        trainer.logs.close()
    code = exit_code(cfg, trainer.stop_reason)
    shutdown(ctx, code)
    return code
