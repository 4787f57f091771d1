"""Autoregressive generation: the prompt is run once to fill the KV cache, then one token per step.

Greedy when the temperature is 0 (argmax, ties to the lowest id, as `transformers` does), otherwise
temperature plus nucleus (top-p) sampling from a generator seeded by `seed` alone, so a seed reproduces
its output for the same weights on the same machine. Single sequence, single process; it knows tokens,
not tokenizers or checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from truestep.model.kv_cache import KVCache
from truestep.model.llama import Transformer


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 64
    temperature: float = 0.0
    """0 = greedy."""
    top_p: float = 1.0
    """Sample only from the smallest set of tokens whose probability reaches top_p (1 = all)."""
    seed: int = 0

    def check(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):  # NaN fails every comparison
            raise ValueError(f"temperature must be >= 0 and finite (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")


@dataclass
class Generation:
    prompt_ids: list[int]
    new_ids: list[int] = field(default_factory=list)
    stop_reason: str = "length"
    """"eos" (an end-of-sequence id was generated; it is the last of new_ids) or "length"."""


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """Pick the next id from one position's (vocab,) logits."""
    if sampling.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / sampling.temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    if sampling.top_p < 1:
        # Keep a token while the mass before it is below top_p: the most likely one always stays.
        sorted_probs = sorted_probs * ((sorted_probs.cumsum(0) - sorted_probs) < sampling.top_p)
    choice = torch.multinomial(sorted_probs, 1, generator=generator)
    return int(order[choice])


@torch.no_grad()
def generate(
    model: Transformer, prompt_ids: list[int], sampling: Sampling, eos_ids: Iterable[int] = ()
) -> Generation:
    """Continue `prompt_ids` by up to `sampling.max_new_tokens` tokens, stopping after any of `eos_ids`."""
    sampling.check()
    if not prompt_ids:
        raise ValueError("the prompt is empty: give at least one token")
    vocab = model.cfg.vocab_size
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
        raise ValueError(f"prompt ids must be in [0, {vocab}) (model.vocab_size)")
    # The last new token is never fed back, so the cache needs one position less than the total.
    positions = len(prompt_ids) + sampling.max_new_tokens - 1
    if positions > model.cfg.max_seq_len:
        raise ValueError(
            f"{len(prompt_ids)} prompt tokens + {sampling.max_new_tokens} new ones need {positions} positions, "
            f"more than model.max_seq_len={model.cfg.max_seq_len}; lower --max-new-tokens or shorten the prompt"
        )
    model.eval()
    param = next(model.parameters())
    cache = KVCache(model.cfg, 1, positions, param.dtype, param.device)
    generator = torch.Generator(device="cpu").manual_seed(sampling.seed)
    stop = set(eos_ids)
    result = Generation(list(prompt_ids))
    tokens = torch.tensor([prompt_ids], dtype=torch.long, device=param.device)
    for _ in range(sampling.max_new_tokens):
        logits = model(tokens, cache)[0, -1].cpu()
        token = next_token(logits, sampling, generator)
        result.new_ids.append(token)
        if token in stop:
            result.stop_reason = "eos"
            break
        tokens = torch.tensor([[token]], dtype=torch.long, device=param.device)
    return result
