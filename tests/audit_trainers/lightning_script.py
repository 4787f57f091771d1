"""A tiny PyTorch Lightning job for `truestep audit` tests: an MLP with dropout on a seeded synthetic
data set, shuffled every epoch, a checkpoint at every epoch's end (`last.ckpt`), and a JSON-lines log
of loss, grad norm and learning rate per step written by a callback. Started again on the same
directory it resumes with `ckpt_path="last"`.

Lightning does not checkpoint the RNG streams: the next epoch's shuffle and the dropout masks after a
resume come from whatever the restarted process's generators hold. The script restores them with a
callback (`RngState`) and final weights are written as safetensors. The switch
  --no-rng-restore    leave the callback out: Lightning's default, and a resume that is not the
                      uninterrupted run (another shuffle, other dropout masks)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from safetensors.torch import save_file
from torch import nn

DIM, ROWS, BATCH = 8, 32, 8
EXTRA_FLAGS = "AUDIT_TEST_FLAGS"
"""More flags from the environment: the tests give them to the faulted run only (the audit's
fingerprint is its command line, so the failure-free runs stay comparable)."""


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
        self.grad_norm = float("nan")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad.detach().flatten() for p in self.parameters() if p.grad is not None]
        self.grad_norm = float(torch.cat(grads).norm())

    def configure_optimizers(self) -> dict:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=12)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class JsonLog(pl.Callback):
    """One line per optimizer step, flushed as written."""

    def __init__(self, path: Path, pace: float) -> None:
        self.path, self.pace = path, pace

    def on_train_batch_end(self, trainer, module, outputs, batch, index) -> None:  # noqa: ANN001
        line = {
            "step": trainer.global_step,
            "loss": float(outputs["loss"]),
            "grad_norm": module.grad_norm,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            "time": time.time(),
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
        time.sleep(self.pace)  # a real step takes this long: the audit can stop the job at a step


class RngState(pl.Callback):
    """Every RNG stream the run draws from, saved in and restored from the checkpoint."""

    def on_save_checkpoint(self, trainer, module, checkpoint) -> None:  # noqa: ANN001
        checkpoint["rng_torch"] = torch.get_rng_state()

    def on_load_checkpoint(self, trainer, module, checkpoint) -> None:  # noqa: ANN001
        torch.set_rng_state(checkpoint["rng_torch"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--step-sleep", type=float, default=0.15)
    p.add_argument("--no-rng-restore", action="store_true")
    a = p.parse_args(sys.argv[1:] + os.environ.get(EXTRA_FLAGS, "").split())
    run = Path(a.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(ROWS, DIM, generator=g)
    y = (x @ torch.randn(DIM, 1, generator=g)).squeeze(1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=run / "ckpt", save_last=True, save_top_k=-1, every_n_epochs=1)
    callbacks = [ckpt, JsonLog(run / "log.jsonl", a.step_sleep)] + ([] if a.no_rng_restore else [RngState()])
    trainer = pl.Trainer(
        max_epochs=a.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
        deterministic=True,
    )
    model = Model()
    resume = "last" if (run / "ckpt" / "last.ckpt").exists() else None
    trainer.fit(model, data, ckpt_path=resume)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(run / "final.safetensors"))


if __name__ == "__main__":
    main()
