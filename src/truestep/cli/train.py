"""`truestep train [CONFIG] [--section.key=value ...]`: wire the rooms together and run the loop."""

from __future__ import annotations

import argparse

from truestep.checkpoint.hook import CheckpointHook
from truestep.config.load import load_config
from truestep.parallel.dist import init_distributed, shutdown
from truestep.telemetry.hook import MetricsHook
from truestep.train.loop import train_loop
from truestep.train.trainer import Trainer


def build_hooks() -> list:
    # Checkpoint first: on_start restores state the metrics hook then reports from.
    return [CheckpointHook(), MetricsHook()]


def train_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="truestep train",
        description="Train (or resume) a run. Launch under torchrun for several processes.",
    )
    parser.add_argument("config", nargs="?", default="tiny", help="TOML file or preset name (default: tiny)")
    args, overrides = parser.parse_known_args(argv)
    cfg = load_config(args.config, overrides)
    ctx = init_distributed(cfg)
    trainer = Trainer(cfg, ctx)
    try:
        train_loop(trainer, build_hooks())
    finally:
        trainer.logs.close()
    shutdown(ctx, 0)
    return 0
