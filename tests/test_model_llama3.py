"""Llama 3.1/3.2 model features: llama3 RoPE scaling, a decoupled head_dim, the KV cache, generation.

RoPE frequencies are compared with transformers' own llama3 rope function (fp32) on the same config;
the KV-cache path with the full (training) forward of the same weights.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from truestep.config import ConfigError, ModelConfig, load_config
from truestep.model.generate import Sampling, generate, next_token
from truestep.model.kv_cache import KVCache
from truestep.model.llama import Transformer, count_parameters
from truestep.model.rope import Llama3Scaling, inv_frequencies, rope_scaling

SCALED = {
    "rope_scaling": "llama3",
    "rope_scaling_factor": 4.0,
    "rope_low_freq_factor": 1.0,
    "rope_high_freq_factor": 4.0,
    "rope_original_max_seq_len": 32,
}


def _cfg(**changes) -> ModelConfig:
    return dataclasses.replace(load_config("tiny").model, **changes)


def _model(**changes) -> Transformer:
    model = Transformer(_cfg(**changes))
    model.init_weights(0)
    return model.eval()


@pytest.mark.parametrize(
    ("head_dim", "theta", "factor", "original"),
    [(16, 10000.0, 4.0, 32), (64, 500000.0, 32.0, 8192), (128, 500000.0, 8.0, 8192)],
)
def test_llama3_frequencies_match_transformers(head_dim, theta, factor, original) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = transformers.LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=original * 16,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": theta,
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        },
    )
    theirs, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](hf)
    assert attention_factor == 1.0  # llama3 scaling does not rescale cos/sin
    scaling = Llama3Scaling(factor, 1.0, 4.0, original)
    ours = inv_frequencies(head_dim, theta, scaling)
    torch.testing.assert_close(ours.float(), theirs, rtol=2e-6, atol=0)
    # All three regimes occur, so the comparison covers the blend as well as both ends.
    plain = inv_frequencies(head_dim, theta)
    unchanged = torch.isclose(ours, plain, rtol=1e-12, atol=0)
    divided = torch.isclose(ours, plain / factor, rtol=1e-12, atol=0)
    assert unchanged.any() and divided.any() and (~unchanged & ~divided).any()


def test_rope_scaling_reads_the_config() -> None:
    assert rope_scaling(_cfg()) is None
    assert rope_scaling(_cfg(**SCALED)) == Llama3Scaling(4.0, 1.0, 4.0, 32)
    plain, scaled = _model(), _model(**SCALED)
    # Position 0 is never rotated; later positions are, differently once low frequencies are stretched.
    assert torch.equal(plain.rope_cos[0], scaled.rope_cos[0])
    assert (plain.rope_cos[40] - scaled.rope_cos[40]).abs().max() > 0.1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_scaling": "yarn"}, "model.rope_scaling must be none|llama3"),
        ({"rope_scaling_factor": 32.0}, "has no effect while model.rope_scaling='none'"),
        ({**SCALED, "rope_scaling_factor": 0.5}, "model.rope_scaling_factor must be >= 1"),
        ({**SCALED, "rope_high_freq_factor": 1.0}, "must be positive and below model.rope_high_freq_factor"),
        ({**SCALED, "rope_original_max_seq_len": 0}, "model.rope_original_max_seq_len must be positive"),
        ({"head_dim": 15}, "head width (15"),
        ({"head_dim": -2}, "model.head_dim must be >= 0"),
        ({"dim": 62}, "or set model.head_dim"),
    ],
)
def test_validation_names_the_key(changes: dict, message: str) -> None:
    overrides = [f"--model.{key}={value}" for key, value in changes.items()]
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("tiny", overrides)


def test_explicit_head_dim_sets_the_projection_shapes() -> None:
    # dim 60 with 4 heads of 24: the head width is not dim / n_heads: fine with an explicit head width.
    cfg = load_config("tiny", ["--model.dim=60", "--model.head_dim=24", "--model.multiple_of=16"]).model
    model = Transformer(cfg)
    attn = model.layers["0"].attention
    assert attn.wq.weight.shape == (4 * 24, 60) and attn.wk.weight.shape == (2 * 24, 60)
    assert attn.wo.weight.shape == (60, 4 * 24)
    assert model.rope_cos.shape == (cfg.max_seq_len, 24)
    derived = count_parameters(dataclasses.replace(cfg, dim=64, head_dim=0))
    explicit = count_parameters(dataclasses.replace(cfg, dim=64, head_dim=16))  # = 64 / 4 heads
    assert derived == explicit
    model.init_weights(0)
    assert model(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, cfg.vocab_size)


# --------------------------------------------------------------------------- KV cache and generation


@pytest.mark.parametrize("changes", [{}, {**SCALED, "head_dim": 24, "tie_embeddings": True}])
def test_cached_decoding_matches_the_full_forward(changes: dict) -> None:
    model = _model(**changes)
    tokens = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(model.cfg, 2, 48, torch.float32, torch.device("cpu"))
        # A prompt, a multi-token chunk after it (explicit mask), then one token at a time.
        parts = [model(tokens[:, :20], cache), model(tokens[:, 20:27], cache)]
        parts += [model(tokens[:, i : i + 1], cache) for i in range(27, 48)]
    assert cache.length == 48
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="KV cache full"):
        model(tokens[:, :1], cache)


def test_generation_beyond_max_seq_len_is_refused() -> None:
    model = _model()  # tiny: max_seq_len 256
    with pytest.raises(ValueError, match="lower --max-new-tokens"):
        generate(model, [1] * 200, Sampling(max_new_tokens=60))
    with pytest.raises(ValueError, match="beyond model.max_seq_len"):
        model(torch.zeros(1, 257, dtype=torch.long))


def test_greedy_generation_is_the_argmax_chain_and_stops_at_eos() -> None:
    model = _model(**SCALED)
    prompt = [5, 17, 300, 42]
    out = generate(model, prompt, Sampling(max_new_tokens=12))
    assert out.stop_reason == "length" and len(out.new_ids) == 12
    # Reference: re-run the whole sequence without a cache at every step.
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert out.new_ids == seq[len(prompt) :]
    eos = out.new_ids[4]
    first = out.new_ids.index(eos)
    stopped = generate(model, prompt, Sampling(max_new_tokens=12), eos_ids=[eos])
    assert stopped.stop_reason == "eos" and stopped.new_ids == out.new_ids[: first + 1]


def test_sampling_is_reproducible_per_seed() -> None:
    model = _model()

    def sample(seed: int, top_p: float = 1.0) -> list[int]:
        sampling = Sampling(max_new_tokens=16, temperature=1.5, top_p=top_p, seed=seed)
        return generate(model, [1, 2, 3], sampling).new_ids

    assert sample(3) == sample(3)
    assert sample(3) != sample(4)
    # A nucleus so small that only the most likely token survives is greedy decoding.
    assert sample(3, top_p=1e-9) == generate(model, [1, 2, 3], Sampling(max_new_tokens=16)).new_ids


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.tensor([0.1, 0.5, 0.3, 0.1]).log()
    gen = torch.Generator().manual_seed(0)
    seen = {next_token(logits, Sampling(temperature=1.0, top_p=0.75), gen) for _ in range(300)}
    assert seen == {1, 2}  # 0.5 + 0.3 reaches 0.75: ids 0 and 3 are cut
    seen = {next_token(logits, Sampling(temperature=1.0, top_p=0.85), gen) for _ in range(400)}
    assert {1, 2} < seen  # 0.8 is below 0.85: one of the 0.1 tokens joins
    assert next_token(logits, Sampling(), gen) == 1
    for bad in (Sampling(temperature=-1.0), Sampling(top_p=0.0), Sampling(max_new_tokens=0)):
        with pytest.raises(ValueError):
            bad.check()
