"""`truestep train [CONFIG] [--section.key=value ...]`: load the config, start the heartbeat, then run.

Everything up to the first heartbeat uses the standard library only; torch, the model and the data are
imported after it (in `truestep.train.run`), so a rank that stops while importing is visible to the
supervisor's start-up deadline within a fraction of a second of being spawned.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from truestep.config.load import load_config
from truestep.core.env import world_from_env
from truestep.core.status import RankStatus
from truestep.faults.hooks import arm, fault_point
from truestep.faults.hooks import set_context as set_fault_context
from truestep.faults.spec import parse_faults, requested_faults
from truestep.resilience.attempt import supervised_attempt
from truestep.resilience.heartbeat import Heartbeat


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
    arm(parse_faults(requested_faults(args.fault)))
    status = RankStatus()
    run_dir = Path(cfg.run.dir)
    attempt = supervised_attempt(run_dir)
    if attempt is not None:
        set_fault_context(run_dir=run_dir, attempt=attempt.number)
    fault_point("startup")
    if attempt is not None and cfg.resilience.heartbeat:
        rank, interval = world_from_env()[0], cfg.resilience.heartbeat_interval_s
        Heartbeat(run_dir, rank, attempt.number, status, interval, attempt.fence).start()
    from truestep.train.run import run_training  # torch and the model: after the first heartbeat

    return run_training(cfg, status, attempt)
