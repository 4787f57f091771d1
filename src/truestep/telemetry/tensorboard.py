"""Optional TensorBoard output of the same scalars as metrics.jsonl."""

from __future__ import annotations

from pathlib import Path


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


class TensorBoardSink:
    """The run's TensorBoard output, shared by the hooks that write scalars (metrics, the resume
    self-check) without either holding the other: opened once, at the step the run starts from."""

    def __init__(self, log_dir: Path, enabled: bool) -> None:
        self.log_dir = log_dir
        self.enabled = enabled
        self.writer: TensorBoardWriter | None = None

    def open(self, start_step: int) -> None:
        """Idempotent: the first caller opens the writer."""
        if self.enabled and self.writer is None:
            self.writer = TensorBoardWriter(self.log_dir, start_step)

    def scalars(self, step: int, fields: dict[str, float]) -> None:
        if self.writer is not None:
            self.writer.scalars(step, fields)

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.writer is not None:
            self.writer.scalar(tag, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
