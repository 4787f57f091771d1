"""AdamW over fp32 master weights (parameters are fp32; bf16 exists only in FSDP's compute copies)."""

from __future__ import annotations

import torch
from torch import nn

from truestep.config.schema import JobConfig


def build_optimizer(model: nn.Module, cfg: JobConfig) -> torch.optim.AdamW:
    o = cfg.optim
    decay, no_decay = [], []
    for param in model.parameters():
        # Decay weight matrices only; 1-D RMSNorm gains are left undecayed.
        (no_decay if param.ndim < 2 else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": o.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, foreach=o.foreach)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
