"""One step's loss: how the micro-batches' token losses become the logged loss and the gradient.

Without a mask (pretraining) the loss is the mean of the micro-batches' mean token losses, averaged over
the data-parallel ranks (every micro-batch has the same number of targets, so that is the token mean);
these are the operations, in the order, truestep always ran, so pretraining is bit for bit what it was.

With a mask (chat data: targets of IGNORE_INDEX outside the assistant's turns) micro-batches hold
different numbers of trained tokens, and a mean of means would weigh a token by how crowded its
micro-batch is and change with the micro-batch size and the data-parallel layout. So each micro-batch
contributes its loss *sum*, and the divisor is the number of trained tokens in the whole global batch,
counted on every rank and summed over the data-parallel group before the first forward: every layout
computes the same quantity, the mean over the global batch's trained tokens. A global batch without any
trained token divides by 1 (loss 0, zero gradients), never by 0.

The trainer's step and the resume witness's forward (train/selfcheck/witness.py) both go through
`StepLoss`, so the loss a graceful stop records is the one the resumed step logs, bit for bit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from truestep.data.loader import IGNORE_INDEX
from truestep.parallel.dist import DistContext

Batch = list[tuple[torch.Tensor, torch.Tensor]]


def trained_tokens(microbatches: Batch, ctx: DistContext) -> int:
    """Collective over the data-parallel group: the trained targets of this step on all its ranks."""
    local = sum(int((targets != IGNORE_INDEX).sum()) for _, targets in microbatches)
    count = torch.tensor(local, dtype=torch.int64, device=ctx.device)
    if ctx.distributed and ctx.dp > 1:
        dist.all_reduce(count, op=dist.ReduceOp.SUM, group=ctx.dp_group())
    return int(count.item())


class StepLoss:
    """The loss of one step's micro-batches (this rank's), masked or not (module docstring).

    Collective when `masked`: constructing it counts the trained tokens over the data-parallel group.
    """

    def __init__(self, microbatches: Batch, ctx: DistContext, masked: bool) -> None:
        self.ctx = ctx
        self.masked = masked
        self.count = len(microbatches)
        self.tokens = trained_tokens(microbatches, ctx) if masked else 0

    def microbatch(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One micro-batch's term: its mean token loss (pretraining) or its trained tokens' loss sum."""
        reduction = "sum" if self.masked else "mean"
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)

    def for_backward(self, term: torch.Tensor) -> torch.Tensor:
        """What a micro-batch's term is back-propagated as. Masked: FSDP averages gradients over the dp
        ranks, so dp / tokens leaves the gradient of (sum over all ranks) / tokens."""
        if self.masked:
            return term * (self.ctx.dp / max(self.tokens, 1))
        return term / self.count

    def global_loss(self, local_sum: torch.Tensor) -> torch.Tensor:
        """Collective over the data-parallel group: the step's loss from this rank's sum of terms."""
        loss = local_sum / (max(self.tokens, 1) if self.masked else self.count)
        if self.ctx.distributed and self.ctx.dp > 1:
            dist.all_reduce(loss, op=dist.ReduceOp.SUM, group=self.ctx.dp_group())
            if not self.masked:
                loss /= self.ctx.dp
        return loss
