"""A tiny Hugging Face Trainer job for `truestep audit` tests: an MLP regressor with dropout on a seeded
synthetic data set, TensorBoard logs, a checkpoint every few steps, and the final weights as safetensors.

Started again on the same directory it resumes from its newest checkpoint (`resume_from_checkpoint`), as
a requeued job does. Two switches break the resume the way real configurations do:
  --ignore-data-skip       TrainingArguments(ignore_data_skip=True): the resumed run replays the batches
                           the first attempt already consumed
  --drop-optimizer-state   delete optimizer.pt from the checkpoint before resuming (a copy tool that
                           synced only the weights): Trainer silently starts a fresh AdamW
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint

DIM, ROWS = 8, 256


class Data(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(ROWS, DIM, generator=g)
        self.y = (self.x @ torch.randn(DIM, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(ROWS, generator=g)

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = self.net(x).squeeze(-1)
        loss = nn.functional.mse_loss(out, labels) if labels is not None else None
        return {"loss": loss, "logits": out}


class Pace(TrainerCallback):
    """Seconds of sleep after each step: a real step takes that long, so the audit can stop the job at a
    step it watches for instead of after the whole run."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
        time.sleep(self.seconds)


EXTRA_FLAGS = "AUDIT_TEST_FLAGS"
"""More flags from the environment: the tests give them to the faulted run only (the audit's
fingerprint is its command line, so the failure-free runs stay comparable)."""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-steps", type=int, default=4)
    p.add_argument("--step-sleep", type=float, default=0.15)
    p.add_argument("--ignore-data-skip", action="store_true")
    p.add_argument("--drop-optimizer-state", action="store_true")
    a = p.parse_args(sys.argv[1:] + os.environ.get(EXTRA_FLAGS, "").split())
    out = Path(a.run_dir) / "out"
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=a.steps,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        logging_steps=1,
        save_steps=a.save_steps,
        seed=0,
        report_to=["tensorboard"],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        ignore_data_skip=a.ignore_data_skip,
        max_grad_norm=1.0,
    )
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(Path(a.run_dir) / "tb")
    last = get_last_checkpoint(str(out)) if out.is_dir() else None
    if last and a.drop_optimizer_state:
        Path(last, "optimizer.pt").unlink(missing_ok=True)
    set_seed(0)  # before the model exists: its initial weights are part of the seeded trajectory
    trainer = Trainer(model=Model(), args=args, train_dataset=Data(), callbacks=[Pace(a.step_sleep)])
    trainer.train(resume_from_checkpoint=last)
    trainer.save_model(str(Path(a.run_dir) / "final"))


if __name__ == "__main__":
    main()
