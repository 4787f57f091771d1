"""`truestep train [CONFIG] [--section.key=value ...]`: load the config and the launch record, run the
rank (train/rank.py), exit with its code.

Everything up to the rank's first heartbeat uses the standard library only; torch, the model and the
data are imported after it, so a rank that stops while importing is visible to the supervisor's start-up
deadline within a fraction of a second of being spawned. A rank started by `truestep launch` loads the
attempt's resolved config its launch record names (TRUESTEP_CONFIG_FILE), never the user's file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from truestep.config.attempt import load_attempt_config
from truestep.config.load import load_config
from truestep.core.errors import UsageError, end_process
from truestep.core.launch import Launch
from truestep.core.names import ENV_CONFIG_FILE
from truestep.faults.optin import ALLOW_FLAG, faults_to_arm
from truestep.train.rank import run_rank


def train_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="truestep train",
        description="Train (or resume) a run. Launch with `truestep launch` or torchrun for several processes.",
    )
    parser.add_argument("config", nargs="?", default=None, help="TOML file or preset name (default: tiny)")
    parser.add_argument(
        "--fault", action="append", default=[], help="fault spec (repeatable); see docs/faults.md"
    )
    parser.add_argument(
        ALLOW_FLAG, action="store_true", help="arm the faults of $TRUESTEP_FAULTS (docs/faults.md)"
    )
    args, overrides = parser.parse_known_args(argv)
    launch = Launch.from_env()
    if launch.config_file and args.config is not None:
        raise UsageError(
            f"this rank was launched with the config file {launch.config_file} ({ENV_CONFIG_FILE}); "
            f"it cannot also load {args.config}"
        )
    if launch.config_file:  # the supervisor's attempt config, verified against the hash it handed over
        cfg = load_attempt_config(Path(launch.config_file), launch.config_sha256, overrides)
    else:
        cfg = load_config(args.config or "tiny", overrides)
    allowed = args.allow_env_faults or cfg.run.allow_env_faults
    launch = faults_to_arm(launch, args.fault, allowed, "truestep train")
    # The rank returns its code; the process leaves through os._exit (core.errors.end_process: why).
    end_process(run_rank(cfg, launch))
