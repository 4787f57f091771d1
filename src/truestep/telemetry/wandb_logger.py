"""Optional Weights & Biases output of the step scalars and evaluations (metrics.wandb).

The package is optional (`pip install 'truestep[wandb]'`); asking for it without the package installed
is one line and exit 2. `offline` writes under <run.dir>/wandb and needs no network or account (sync it
later with `wandb sync`); `online` needs both. Each attempt is its own W&B run, grouped by the run
directory: a resumed attempt recomputes steps an earlier one may have logged, and W&B refuses a step
that goes backwards within one run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from truestep.config.errors import ConfigError
from truestep.config.load import to_dict
from truestep.config.schema import JobConfig


class WandbWriter:
    def __init__(self, run_dir: Path, cfg: JobConfig, mode: str, attempt: int) -> None:
        try:
            import wandb
        except ImportError as err:
            raise ConfigError(
                f"metrics.wandb={mode} needs the wandb package: pip install 'truestep[wandb]' "
                "(or set metrics.wandb=off)"
            ) from err
        name = cfg.run.name or run_dir.name
        self.run = wandb.init(
            project=cfg.metrics.wandb_project,
            group=str(run_dir.resolve()),
            name=f"{name} attempt {attempt}",
            dir=str(run_dir),
            mode=mode,
            config=to_dict(cfg),
            settings=wandb.Settings(silent=True, console="off"),
            reinit="create_new",
        )

    @property
    def directory(self) -> str:
        """Where this W&B run writes its files."""
        return os.fspath(self.run.dir)

    def log(self, step: int, values: dict[str, Any]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
