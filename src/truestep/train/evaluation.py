"""Held-out evaluation (eval.*): the mean token loss and perplexity of the model on a fixed set of
windows from a prepared data directory.

Deterministic by construction: the windows are always the first `eval.samples` of `eval.path`, in
order; data-parallel rank r takes every dp-th one from r; each rank sums its per-token losses in
float64, and one all-reduce over the data-parallel group adds the sums. Chat data (a loss mask) counts
the trained tokens only: the mean over the assistant's tokens, as training's loss. No random number is drawn
(the model is put in eval mode, so dropout is off), so evaluating does not change the trajectory, and
weights restored bit for bit evaluate bit for bit the same.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from truestep.config.errors import ConfigError
from truestep.config.schema import JobConfig
from truestep.data import TokenDataset
from truestep.data.loader import IGNORE_INDEX
from truestep.parallel.dist import DistContext
from truestep.parallel.parallelize import reshard


@dataclass(frozen=True)
class EvalResult:
    loss: float
    """Mean cross-entropy per target token (nats)."""
    perplexity: float
    tokens: int
    seconds: float


class Evaluator:
    def __init__(self, cfg: JobConfig, ctx: DistContext, model_vocab: int) -> None:
        e = cfg.eval
        self.dataset = TokenDataset(Path(e.path).expanduser(), cfg.data.seq_len)
        if e.samples > len(self.dataset):
            raise ConfigError(
                f"eval.samples={e.samples} but {e.path} holds only {len(self.dataset)} windows of "
                f"data.seq_len={cfg.data.seq_len} tokens; lower eval.samples or prepare more held-out text"
            )
        if e.samples % ctx.dp:
            raise ConfigError(
                f"eval.samples={e.samples} must be a multiple of the data-parallel size {ctx.dp}"
            )
        if self.dataset.vocab_size > model_vocab:
            raise ConfigError(
                f"eval.path vocabulary ({self.dataset.vocab_size}) exceeds model.vocab_size={model_vocab}: "
                "prepare the held-out data with the training data's tokenizer"
            )
        if self.dataset.has_mask and not self.dataset.masks(list(range(e.samples)))[:, 1:].any():
            # Its loss would be 0/0: refused here rather than logged as a number that means nothing.
            raise ConfigError(
                f"eval.path {e.path} is chat data whose first eval.samples={e.samples} windows train no "
                "token (no assistant turn in them): raise eval.samples or prepare other held-out chats"
            )
        self.indices = list(range(ctx.dp_rank, e.samples, ctx.dp))
        self.batch_size = e.batch_size
        self.ctx = ctx

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> EvalResult:
        """Collective (every rank, the same number of forwards)."""
        began = time.perf_counter()
        was_training = model.training
        model.eval()
        device = self.ctx.device
        total = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, target tokens
        try:
            for start in range(0, len(self.indices), self.batch_size):
                indices = self.indices[start : start + self.batch_size]
                rows = torch.from_numpy(self.dataset.samples(indices))
                inputs, targets = rows[:, :-1].to(device), rows[:, 1:].to(device)
                if self.dataset.has_mask:
                    kept = torch.from_numpy(self.dataset.masks(indices)[:, 1:] != 0).to(device)
                    targets = torch.where(kept, targets, IGNORE_INDEX)
                logits = model(inputs)
                loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
                total[0] += loss.double()
                total[1] += int((targets != IGNORE_INDEX).sum())
        finally:
            model.train(was_training)
            reshard(model)  # a forward without a backward leaves FSDP's root gathered
        if self.ctx.distributed and self.ctx.dp > 1:
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.ctx.dp_group())
        mean = float(total[0] / total[1])
        return EvalResult(mean, math.exp(min(mean, 700.0)), int(total[1]), time.perf_counter() - began)
