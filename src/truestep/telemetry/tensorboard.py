"""Optional TensorBoard output of the same scalars as metrics.jsonl."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


class TensorBoardWriter:
    def __init__(self, log_dir: Path, start_step: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # tensorboard is an optional extra
            raise RuntimeError(
                "metrics.tensorboard=true needs the tensorboard package: pip install tensorboard"
            ) from err
        # On resume, drop what a crashed attempt logged past the restored step (it is recomputed).
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=start_step + 1 if start_step else None)

    def scalars(self, step: int, fields: dict[str, float]) -> None:
        for key, value in fields.items():
            if key != "step":
                self.writer.add_scalar(f"train/{key}", value, step)

    def scalar(self, tag: str, value: float, step: int) -> None:
        """One scalar outside train/ (e.g. `resume/self_check`)."""
        self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()


class ScalarSinks:
    """The run's scalar outputs beyond metrics.jsonl -- TensorBoard and W&B, each when it is on -- shared by
    the hooks that write scalars (metrics, evaluation, the resume self-check) without any of them holding
    another: opened once, at the step the run starts from, by whichever hook starts first."""

    def __init__(self, tensorboard_dir: Path | None, wandb: Callable[[], Any] | None = None) -> None:
        self.tensorboard_dir = tensorboard_dir
        """None: TensorBoard off (or not rank 0)."""
        self.make_wandb = wandb
        """Opens the W&B writer (telemetry/wandb_logger.py); None: W&B off (or not rank 0)."""
        self.tensorboard: TensorBoardWriter | None = None
        self.wandb: Any = None
        self.opened = False

    def open(self, start_step: int) -> None:
        """Idempotent: the first caller opens the writers."""
        if self.opened:
            return
        self.opened = True
        if self.tensorboard_dir is not None:
            self.tensorboard = TensorBoardWriter(self.tensorboard_dir, start_step)
        if self.make_wandb is not None:
            self.wandb = self.make_wandb()

    def train(self, step: int, fields: dict[str, float]) -> None:
        """A step's training scalars (train/ in TensorBoard and W&B)."""
        if self.tensorboard is not None:
            self.tensorboard.scalars(step, fields)
        if self.wandb is not None:
            self.wandb.log(step, {f"train/{k}": v for k, v in fields.items() if k != "step"})

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Scalars outside train/ (e.g. `eval/loss`, `resume/self_check`)."""
        if self.tensorboard is not None:
            for tag, value in values.items():
                self.tensorboard.scalar(tag, value, step)
        if self.wandb is not None:
            self.wandb.log(step, values)

    def close(self) -> None:
        """Also when the loop did not end normally: the W&B run is finished either way."""
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.wandb is not None:
            wandb, self.wandb = self.wandb, None
            wandb.close()
