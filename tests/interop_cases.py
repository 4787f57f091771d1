"""Shared constants and helpers for the interop tests (test_interop_hf.py, test_interop_import.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
from pathlib import Path
from typing import Any

import pytest
import torch

from truestep.checkpoint.init_from import load_init_weights
from truestep.checkpoint.weights import read_model_config
from truestep.cli.interop import interop_main
from truestep.model.llama import Transformer

STEPS = 3
COMMON = [f"--train.max_steps={STEPS}", "--checkpoint.interval=0", "--schedule.warmup_steps=1"]
LAYOUTS = {
    "single": (1, []),
    "fsdp2": (2, []),
    "tp2": (2, ["--parallel.tp=2"]),
    "tied-fsdp2": (2, ["--model.tie_embeddings=true"]),
    "tied-tp2": (2, ["--model.tie_embeddings=true", "--parallel.tp=2"]),
}

needs_safetensors = pytest.mark.skipif(
    importlib.util.find_spec("safetensors") is None,
    reason="safetensors is not installed (pip install 'truestep[hf]')",
)


def transformers_or_skip():
    return pytest.importorskip(
        "transformers",
        reason="transformers is not installed (pip install 'truestep[dev]'); parity not checked",
    )


def cli(*argv: object) -> tuple[int, str, str]:
    """interop_main in process (a subprocess per call costs seconds of torch import)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = interop_main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def tokens(vocab: int, seq: int = 48) -> torch.Tensor:
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(7))


def truestep_model(ckpt_dir: Path) -> Transformer:
    model = Transformer(read_model_config(ckpt_dir))
    facts = load_init_weights(model, ckpt_dir)
    assert facts["config_differences"] == []
    return model.eval()


def assert_scaled_rope_matches(step_dir: Path, hf_model: Any, toks: torch.Tensor, past: int) -> None:
    """The imported model's logits equal transformers' (fp32), and the RoPE scaling is what makes them
    equal: the same weights without it give another function from position `past` on."""
    cfg = read_model_config(step_dir)
    with torch.no_grad():
        theirs = hf_model(toks).logits
        ours = truestep_model(step_dir)(toks)
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=0)
    plain = Transformer(dataclasses.replace(cfg, rope_scaling="none", rope_scaling_factor=8.0))
    plain.load_state_dict(truestep_model(step_dir).state_dict())
    with torch.no_grad():
        unscaled = plain.eval()(toks)
    assert (unscaled[:, past:] - theirs[:, past:]).abs().max() > 1e-2


def hf_logits(hf_dir: Path, toks: torch.Tensor) -> torch.Tensor:
    transformers = transformers_or_skip()
    model, info = transformers.LlamaForCausalLM.from_pretrained(
        str(hf_dir), dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info.get("mismatched_keys"), info
    with torch.no_grad():
        return model.eval()(toks).logits


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype == torch.float32, key
        assert a[key].shape == b[key].shape, key
        assert torch.equal(a[key].view(torch.int32), b[key].view(torch.int32)), key


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
