"""Emulated platform noise, for measuring the instrument where the same-seed floor is not zero.

On a GPU two same-seed runs are not bitwise equal: reductions (gradient all-reduce, atomics in
backward kernels) add in an order that changes from run to run, so every step's gradients carry a
relative error of a few ulp, and the runs drift apart, tiny early and larger late. On CPU truestep is
bitwise deterministic, so the instrument's nonzero-floor regime could never be exercised here. This
module emulates that noise; it is an emulation, not a model of any particular GPU:

- `GradientNoise` (`train.emulate_nondeterminism = s`): after backward and before clipping, every
  gradient element g becomes g * (1 + s * e), e ~ N(0, 1).
- `RestoreError` (`train.emulate_restore_error = d`): after every checkpoint restore, every parameter
  element p becomes p * (1 + d * e): a restore that is off by a relative d (a lossy copy, a dtype
  round trip). It is how `benchmarks/detection_power.py` asks how small a wrong restore each
  detection rule still sees.

The noise is drawn from OS entropy (`os.urandom`), never from the run seed: two runs with the same seed
get independent noise, as on a GPU, and a resumed attempt draws fresh noise. Rank 0 draws the entropy
and broadcasts it, and each data-parallel rank derives its own stream from it, so tensor-parallel
ranks that hold the same replicated gradient perturb it identically (their replicas stay equal).
"""

from __future__ import annotations

import os

import torch
from torch.distributed.tensor import DTensor

from truestep.parallel.dist import DistContext, broadcast_int

_MASK = (1 << 63) - 1


def shared_entropy(ctx: DistContext) -> int:
    """Collective: 63 bits of OS entropy drawn on rank 0, the same on every rank."""
    return broadcast_int(int.from_bytes(os.urandom(8), "little") & _MASK, ctx)


def _stream_seed(entropy: int, *parts: int) -> int:
    seed = entropy
    for part in parts:
        seed = (seed * 1_000_003 + part + 1) & _MASK
    return seed


@torch.no_grad()
def _scale_by_noise(tensors: list[torch.Tensor], relative: float, seed: int) -> None:
    """x <- x * (1 + relative * e) elementwise, e ~ N(0, 1) from one generator per tensor."""
    for index, tensor in enumerate(tensors):
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        generator = torch.Generator(device=local.device)
        generator.manual_seed(_stream_seed(seed, index))
        noise = torch.randn(local.shape, generator=generator, dtype=local.dtype, device=local.device)
        local.mul_(noise.mul_(relative).add_(1.0))


class GradientNoise:
    """Emulated reduction-order noise on the gradients (`train.emulate_nondeterminism`)."""

    def __init__(self, scale: float, ctx: DistContext) -> None:
        self.scale = scale
        self.entropy = shared_entropy(ctx)
        self.dp_rank = ctx.dp_rank

    def perturb(self, params: list[torch.nn.Parameter], step: int) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        _scale_by_noise(grads, self.scale, _stream_seed(self.entropy, step, self.dp_rank))


class RestoreError:
    """An emulated wrong restore: parameters off by a relative `train.emulate_restore_error`."""

    def __init__(self, relative: float, ctx: DistContext) -> None:
        self.relative = relative
        self.entropy = shared_entropy(ctx)
        self.dp_rank = ctx.dp_rank
        self.restores = 0

    def perturb(self, params: list[torch.nn.Parameter]) -> None:
        self.restores += 1
        _scale_by_noise(list(params), self.relative, _stream_seed(self.entropy, self.restores, self.dp_rank))
