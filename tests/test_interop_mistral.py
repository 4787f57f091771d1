"""Mistral without a binding sliding window is Llama (issue 28): a model transformers writes as
MistralForCausalLM (v0.3 style: sliding_window null, an explicit head_dim) imports, computes the same
logits as transformers' Mistral, and exports as a LlamaForCausalLM with those logits; a window shorter
than the context (v0.1) is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hostile_cases import one_line, run_cli
from interop_cases import hf_logits, needs_safetensors, tokens, transformers_or_skip, truestep_model
from truestep.cli.interop import interop_main

pytestmark = [needs_safetensors, pytest.mark.usefixtures("offline")]


def mistral(tmp_path: Path, sliding_window: int | None):
    transformers = transformers_or_skip()
    config = transformers.MistralConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        sliding_window=sliding_window,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(config).eval()
    model.save_pretrained(str(tmp_path / "hf"))
    return model


def test_a_mistral_v03_model_imports_with_the_same_logits(tmp_path: Path) -> None:
    theirs_model = mistral(tmp_path, sliding_window=None)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [
        "MistralForCausalLM"
    ]
    rc, _, err = run_cli(interop_main, "import-hf", tmp_path / "hf", "--out", tmp_path / "ckpt")
    assert rc == 0, err
    toks = tokens(256, seq=64)
    with torch.no_grad():
        theirs = theirs_model(toks).logits
    ours = truestep_model(tmp_path / "ckpt" / "step_00000000")
    torch.testing.assert_close(ours(toks), theirs, atol=1e-5, rtol=0)
    rc, _, err = run_cli(interop_main, "export", tmp_path / "ckpt", "--to", "hf", tmp_path / "out")
    assert rc == 0, err
    torch.testing.assert_close(hf_logits(tmp_path / "out", toks), theirs, atol=1e-5, rtol=0)


def test_a_binding_sliding_window_is_refused(tmp_path: Path) -> None:
    mistral(tmp_path, sliding_window=32)
    rc, _, err = run_cli(interop_main, "import-hf", tmp_path / "hf", "--out", tmp_path / "ckpt")
    assert rc == 3
    assert "sliding_window=32 is shorter than max_position_embeddings=128" in one_line(err)
