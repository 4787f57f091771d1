"""Linear RoPE scaling (position interpolation, `rope_type: linear`; issue 28 item 5): imported from a
model transformers builds locally, logits equal to transformers' past the unscaled context, exported back
as the same scaling; the llama3-only keys are refused with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from interop_cases import assert_scaled_rope_matches, cli
from truestep.checkpoint.catalog import step_dir_name
from truestep.checkpoint.weights import read_model_config
from truestep.config import load_config
from truestep.config.errors import ConfigError

pytestmark = pytest.mark.usefixtures("offline")

transformers = pytest.importorskip("transformers")

FACTOR = 4.0
SEQ = 96


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> tuple[Path, Path, object]:
    base = tmp_path_factory.mktemp("linear")
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.1,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": FACTOR},
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(str(base / "hf"))
    rc, out, err = cli("import-hf", base / "hf", "--out", base / "ckpts")
    assert rc == 0, err
    assert 'rope_scaling = "linear"' in (base / "ckpts" / "train.toml").read_text(), out  # import-hf's config
    return base / "hf", base / "ckpts" / step_dir_name(0), model


def test_linear_scaling_imports_with_transformers_logits(imported) -> None:
    _, step_dir, hf_model = imported
    cfg = read_model_config(step_dir)
    assert (cfg.rope_scaling, cfg.rope_scaling_factor) == ("linear", FACTOR)
    toks = torch.randint(0, cfg.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(3))
    assert_scaled_rope_matches(step_dir, hf_model, toks, past=1)


def test_linear_scaling_exports_as_linear(imported, tmp_path: Path) -> None:
    _, step_dir, hf_model = imported
    rc, _, err = cli("export", step_dir, "--to", "hf", tmp_path / "out")
    assert rc == 0, err
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["rope_parameters"]["rope_type"] == "linear"
    assert written["rope_parameters"]["factor"] == FACTOR
    back = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32).eval()
    toks = torch.randint(0, 256, (1, SEQ), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(back(toks).logits, hf_model(toks).logits, atol=2e-5, rtol=0)


def test_llama3_only_keys_are_refused_with_linear() -> None:
    with pytest.raises(ConfigError, match=re.escape("has no effect while model.rope_scaling='linear'")):
        load_config("tiny", ["--model.rope_scaling=linear", "--model.rope_low_freq_factor=2.0"])
    cfg = load_config("tiny", ["--model.rope_scaling=linear", "--model.rope_scaling_factor=2.0"]).model
    assert cfg.rope_scaling == "linear"
