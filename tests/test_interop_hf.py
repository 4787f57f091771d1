"""Interop: `truestep export --to hf` parity with transformers, round trip, sharding, config translation.

Checkpoints come from real training runs (one process, FSDP2 and TP across two processes). Parity with
Hugging Face is checked against transformers' own LlamaForCausalLM, loaded from the exported directory,
on the same tokens (fp32). Nothing is downloaded.

The `runs`/`ckpt` checkpoints and the `offline` fixture live in conftest.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from interop_cases import (
    LAYOUTS,
    bitwise_equal,
    cli,
    hf_logits,
    needs_safetensors,
    tokens,
    truestep_model,
)
from truestep.checkpoint.catalog import step_dir_name
from truestep.checkpoint.init_from import load_init_weights
from truestep.checkpoint.integrity import verify
from truestep.checkpoint.weights import load_model_tensors, read_model_config
from truestep.cli.interop import interop_main
from truestep.core.errors import RefusedError
from truestep.interop import model_config_from_hf
from truestep.interop.hf import ffn_rule_for, hf_config, parse_size
from truestep.model.llama import Transformer, ffn_hidden_dim

pytestmark = pytest.mark.usefixtures("offline")  # never reach the network (fixture in conftest.py)


# ----------------------------------------------------------------------------------------------
# export --to hf: logits parity with transformers, for every layout the checkpoint was saved at


@pytest.mark.multiprocess
@needs_safetensors
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_export_hf_matches_transformers_logits(layout: str, runs, tmp_path: Path) -> None:
    ckpt_dir = runs[layout]
    saved = json.loads((ckpt_dir / "rank00000.json").read_text())["layout"]
    assert saved["world_size"] == LAYOUTS[layout][0]
    out = tmp_path / "hf"
    rc, stdout, err = cli("export", ckpt_dir, "--to", "hf", out)
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == [
        "TOKENIZER.md",  # the demo corpus is byte-tokenized: the note says so
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]

    cfg = read_model_config(ckpt_dir)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    expected = {
        "hidden_size": cfg.dim,
        "intermediate_size": ffn_hidden_dim(cfg),
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }
    assert {k: config[k] for k in expected} == expected
    assert cfg.n_kv_heads < cfg.n_heads  # the tiny model exercises grouped-query attention
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())  # noqa: SIM118 - not a mapping
    assert ("lm_head.weight" in names) is not cfg.tie_embeddings  # transformers re-ties it on load
    assert len(names) == 2 + 9 * cfg.n_layers + (0 if cfg.tie_embeddings else 1)

    toks = tokens(cfg.vocab_size)
    ours = truestep_model(ckpt_dir)(toks)
    theirs = hf_logits(out, toks)
    assert theirs.shape == ours.shape
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)


@pytest.mark.multiprocess
@needs_safetensors
def test_layouts_export_the_same_consolidated_tensors(runs, tmp_path: Path) -> None:
    """The same 3 steps at three layouts: consolidation reassembles full tensors from any sharding."""
    tensors = {name: load_model_tensors(runs[name]) for name in ("single", "fsdp2", "tp2")}
    for name in ("fsdp2", "tp2"):
        assert tensors[name].keys() == tensors["single"].keys()
        for key, value in tensors["single"].items():
            torch.testing.assert_close(tensors[name][key], value, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------
# round trip truestep -> HF -> truestep


@pytest.mark.multiprocess
@needs_safetensors
@pytest.mark.parametrize("layout", ["single", "fsdp2", "tied-fsdp2"])
def test_round_trip_is_bitwise(layout: str, runs, tmp_path: Path) -> None:
    ckpt_dir = runs[layout]
    assert interop_main(["export", str(ckpt_dir), "--to", "hf", str(tmp_path / "hf")]) == 0
    rc, out, err = cli("import-hf", tmp_path / "hf", "--out", tmp_path / "imported")
    assert rc == 0, err
    config = (tmp_path / "imported" / "train.toml").read_text()  # import-hf writes the config to train with
    assert f"truestep train {tmp_path / 'imported' / 'train.toml'}" in out and "dim = 64\n" in config
    step_dir = tmp_path / "imported" / step_dir_name(0)
    verify(step_dir, checksums=True)  # a committed checkpoint: manifest + COMMITTED
    info = json.loads((step_dir / "interop.json").read_text())
    assert info["format"] == "truestep-interop" and info["source"]["type"] == "huggingface"

    original, imported = load_model_tensors(ckpt_dir), load_model_tensors(step_dir)
    if layout.startswith("tied"):  # the import stores a tied weight once; init_from re-ties it (below)
        assert "output.weight" not in imported
        assert torch.equal(original["output.weight"], original["tok_embeddings.weight"])
        original_once = {k: v for k, v in original.items() if k != "output.weight"}
        bitwise_equal(original_once, imported)
    else:
        bitwise_equal(original, imported)

    # The recorded model config builds the same shapes (the FFN rule may be spelled differently).
    a, b = read_model_config(ckpt_dir), read_model_config(step_dir)
    assert ffn_hidden_dim(a) == ffn_hidden_dim(b)
    for key in ("dim", "n_layers", "n_heads", "vocab_size", "norm_eps", "rope_theta", "max_seq_len"):
        assert getattr(a, key) == getattr(b, key), key
    assert (a.n_kv_heads or a.n_heads) == (b.n_kv_heads or b.n_heads)

    # init_from: the imported checkpoint (given as the root) initializes a fresh model exactly.
    model = Transformer(a)
    model.init_weights(seed=123)
    facts = load_init_weights(model, tmp_path / "imported")
    assert facts["step"] == 0 and facts["path"] == str(step_dir)
    bitwise_equal(dict(model.state_dict()), original)


@pytest.mark.multiprocess
@needs_safetensors
def test_import_refuses_an_existing_destination(ckpt, tmp_path: Path) -> None:
    (tmp_path / "out" / step_dir_name(0)).mkdir(parents=True)
    (tmp_path / "out" / step_dir_name(0) / "something").write_text("x")
    assert interop_main(["export", str(ckpt), "--to", "hf", str(tmp_path / "hf")]) == 0
    rc, _, err = cli("import-hf", tmp_path / "hf", "--out", tmp_path / "out")
    assert rc == 3 and "refusing to overwrite" in err
    rc, _, err = cli("export", ckpt, "--to", "hf", tmp_path / "hf")
    assert rc == 3 and "refusing to overwrite" in err


# ----------------------------------------------------------------------------------------------
# sharded safetensors


@pytest.mark.multiprocess
@needs_safetensors
def test_sharded_export_has_an_index_that_transformers_loads(runs, tmp_path: Path) -> None:
    ckpt_dir = runs["fsdp2"]
    out = tmp_path / "hf"
    rc, stdout, err = cli("export", ckpt_dir, "--to", "hf", out, "--max-shard-size", "100KB")
    assert rc == 0, err
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2 and not (out / "model.safetensors").exists()
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert sorted(set(index["weight_map"].values())) == files
    assert len(index["weight_map"]) == 21  # 2 layers x 9 + embed, norm, lm_head
    assert all(name.startswith(("model.", "lm_head.")) for name in index["weight_map"])
    assert index["metadata"]["total_size"] == sum(
        t.numel() * 4 for t in load_model_tensors(ckpt_dir).values()
    )

    toks = tokens(512)
    torch.testing.assert_close(hf_logits(out, toks), truestep_model(ckpt_dir)(toks), atol=1e-5, rtol=0)

    # ... and imports back, bitwise.
    assert interop_main(["import-hf", str(out), "--out", str(tmp_path / "imported")]) == 0
    bitwise_equal(load_model_tensors(tmp_path / "imported" / step_dir_name(0)), load_model_tensors(ckpt_dir))


def test_parse_size() -> None:
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("100KB") == 100_000
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("1.5MB") == 1_500_000
    assert parse_size("4096") == 4096
    for bad in ("five", "5XB", "0", "-1GB"):
        with pytest.raises(RefusedError):
            parse_size(bad)


# ----------------------------------------------------------------------------------------------
# config translation (pure)


@pytest.mark.parametrize(
    ("dim", "intermediate"),
    [(4096, 11008), (4096, 14336), (8192, 28672), (5120, 13824), (64, 192), (48, 100)],
)
def test_ffn_rule_reproduces_any_intermediate_size(dim: int, intermediate: int) -> None:
    from truestep.config.schema import ModelConfig

    multiple_of, multiplier = ffn_rule_for(dim, intermediate)
    assert (
        ffn_hidden_dim(ModelConfig(dim=dim, multiple_of=multiple_of, ffn_dim_multiplier=multiplier))
        == intermediate
    )


def test_llama3_8b_preset_config_round_trips() -> None:
    from truestep.config.load import load_config

    cfg = load_config("llama3-8b").model
    back = model_config_from_hf(hf_config(cfg))
    assert ffn_hidden_dim(back) == ffn_hidden_dim(cfg) == 14336
    assert (back.multiple_of, back.ffn_dim_multiplier) == (1024, 1.3)
    for key in ("dim", "n_layers", "n_heads", "vocab_size", "norm_eps", "rope_theta", "max_seq_len"):
        assert getattr(back, key) == getattr(cfg, key), key
