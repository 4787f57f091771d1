"""Llama 3.1/3.2 interop: llama3 RoPE scaling and a decoupled head_dim through import/export, logits
parity with transformers beyond the original context, the presets' parameter counts, tied embeddings
under TP.

Models are built locally by transformers (tiny shapes); nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from interop_cases import assert_scaled_rope_matches, cli, hf_logits
from truestep.checkpoint.catalog import step_dir_name
from truestep.checkpoint.weights import load_model_tensors, read_model_config
from truestep.config import load_config
from truestep.model.llama import count_parameters

pytestmark = pytest.mark.usefixtures("offline")

transformers = pytest.importorskip("transformers")

# Tiny stand-ins with the real models' structure: rope scaling with an original context of 32 so that
# positions up to 160 are far beyond it, GQA, and (3.2) tied embeddings and a head width != dim/heads.
STYLES = {
    "3.1": {
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    "3.2": {
        "tie_word_embeddings": True,
        "head_dim": 24,  # 4 heads x 24 != hidden 64
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
}
SEQ = 160


def _hf_model(style: str) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=[2, 3] if style == "3.2" else 2,  # instruct models stop at several ids
        initializer_range=0.1,  # larger than the default so logits are far from uniform
        **STYLES[style],
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module", params=list(STYLES))
def imported(request, tmp_path_factory) -> tuple[str, Path, Path, transformers.LlamaForCausalLM]:
    """(style, HF dir written by transformers, the imported step directory, the HF model)."""
    style = request.param
    base = tmp_path_factory.mktemp(f"llama{style}")
    model = _hf_model(style)
    model.save_pretrained(str(base / "hf"))
    rc, out, err = cli("import-hf", base / "hf", "--out", base / "ckpts")
    assert rc == 0, err
    assert 'rope_scaling = "llama3"' in (base / "ckpts" / "train.toml").read_text(), out  # import-hf's config
    return style, base / "hf", base / "ckpts" / step_dir_name(0), model


def _tokens(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(3))


def test_imported_llama3_logits_match_transformers_beyond_the_original_context(imported) -> None:
    style, _, step_dir, hf_model = imported
    cfg = read_model_config(step_dir)
    params = STYLES[style]["rope_parameters"]
    assert cfg.rope_scaling == "llama3" and cfg.rope_scaling_factor == params["factor"]
    assert cfg.rope_original_max_seq_len == 32 and cfg.max_seq_len == 256
    assert cfg.head_dim == (24 if style == "3.2" else 0) and cfg.tie_embeddings is (style == "3.2")
    # Without the scaling the same weights give another function past the original context.
    assert_scaled_rope_matches(step_dir, hf_model, _tokens(cfg.vocab_size), past=40)


def test_transformers_4_spelling_imports_the_same(imported, tmp_path: Path) -> None:
    """transformers 4.x writes rope_theta beside a rope_scaling table instead of rope_parameters."""
    style, hf_dir, step_dir, _ = imported
    legacy = tmp_path / "hf4"
    legacy.mkdir()
    (legacy / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
    config = json.loads((hf_dir / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    (legacy / "config.json").write_text(json.dumps(config))
    rc, _, err = cli("import-hf", legacy, "--out", tmp_path / "ckpt")
    assert rc == 0, err
    assert read_model_config(tmp_path / "ckpt" / step_dir_name(0)) == read_model_config(step_dir)
    # Both spellings at once must agree.
    config["rope_parameters"] = {**rope, "rope_theta": config["rope_theta"], "factor": 2.0}
    (legacy / "config.json").write_text(json.dumps(config))
    rc, _, err = cli("import-hf", legacy, "--out", tmp_path / "other")
    assert rc == 3 and "rope_scaling and rope_parameters describe different RoPE scalings" in err


def test_llama3_export_round_trip(imported, tmp_path: Path) -> None:
    style, hf_dir, step_dir, hf_model = imported
    out = tmp_path / "again"
    rc, _, err = cli("export", step_dir, "--to", "hf", out)
    assert rc == 0, err
    config = json.loads((out / "config.json").read_text())
    source = json.loads((hf_dir / "config.json").read_text())
    for key in ("rope_parameters", "head_dim", "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        assert config[key] == source[key], key
    assert config["rope_scaling"] == {k: v for k, v in source["rope_parameters"].items() if k != "rope_theta"}
    toks = _tokens(384)
    with torch.no_grad():
        theirs = hf_model(toks).logits
    torch.testing.assert_close(hf_logits(out, toks), theirs, atol=2e-5, rtol=0)
    # ... and the weights come back bitwise.
    rc, _, err = cli("import-hf", out, "--out", tmp_path / "back")
    assert rc == 0, err
    back, first = load_model_tensors(tmp_path / "back" / step_dir_name(0)), load_model_tensors(step_dir)
    assert back.keys() == first.keys() and all(torch.equal(back[k], first[k]) for k in first)


# ----------------------------------------------------------------------------------------------
# presets: parameter counts against transformers' LlamaForCausalLM on the meta device

PRESET_SOURCES = {
    # The published config.json values of meta-llama/Llama-3.2-1B and Llama-3.1-8B.
    "llama3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "factor": 32.0,
    },
    "llama3.1-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
        "factor": 8.0,
    },
}


@pytest.mark.parametrize("preset", list(PRESET_SOURCES))
def test_preset_parameter_counts_match_transformers(preset: str) -> None:
    source = dict(PRESET_SOURCES[preset])
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": source.pop("factor"),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    config = transformers.LlamaConfig(
        vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters=rope, **source
    )
    with torch.device("meta"):
        hf_model = transformers.LlamaForCausalLM(config)
    expected = sum(p.numel() for p in hf_model.parameters())  # a tied lm_head counts once
    cfg = load_config(preset).model
    assert count_parameters(cfg) == expected
    assert expected == {"llama3.2-1b": 1_235_814_400, "llama3.1-8b": 8_030_261_248}[preset]
    # The preset exports to exactly that config.
    from truestep.interop.hf import hf_config

    exported = hf_config(cfg)
    for key, value in source.items():
        assert exported[key] == value, key
    assert exported["rope_parameters"] == rope
    assert exported["max_position_embeddings"] == 131072
    # The real model's config.json imports to a config that init_from accepts into the preset silently.
    from truestep.checkpoint.init_from import config_differences as _config_differences
    from truestep.interop.hf_config import model_config_from_hf
    from truestep.model.llama import ffn_hidden_dim

    imported = model_config_from_hf({**config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    assert ffn_hidden_dim(imported) == ffn_hidden_dim(cfg) == source["intermediate_size"]
    assert _config_differences(imported, cfg) == []
    assert count_parameters(imported) == expected


# ----------------------------------------------------------------------------------------------
# tied embeddings under tensor parallelism


@pytest.mark.multiprocess
def test_tied_embeddings_stay_tied_under_tp(runs) -> None:
    """TP gives the embedding and the output projection new parameters; they must be re-tied, or the run
    trains two matrices and the checkpoint holds two different ones."""
    tp, fsdp = load_model_tensors(runs["tied-tp2"]), load_model_tensors(runs["tied-fsdp2"])
    assert torch.equal(tp["output.weight"], tp["tok_embeddings.weight"])
    for key, value in fsdp.items():  # same 3 steps at another layout: the same model
        torch.testing.assert_close(tp[key], value, atol=1e-4, rtol=0)
