"""Streaming import (issue 28): `import-hf` writes one tensor at a time in the dtype asked for (default:
the source's), stores a tied embedding once, and everything that reads checkpoints (export, generation,
init_from, the meta-device precheck) takes the stored-once tie as the tie it is. Bit patterns compared."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from hostile_cases import run_cli
from interop_cases import needs_safetensors
from truestep.checkpoint.init_from import load_init_weights, precheck_init_from
from truestep.checkpoint.weights import load_model_tensors, model_tensor_meta, with_tied_output
from truestep.cli.interop import interop_main
from truestep.config.schema import ModelConfig
from truestep.interop.hf import hf_config
from truestep.interop.inference import load_checkpoint_model
from truestep.interop.names import to_hf
from truestep.model.llama import Transformer

pytestmark = needs_safetensors

TIED = ModelConfig(
    dim=16,
    n_layers=2,
    n_heads=2,
    n_kv_heads=1,
    vocab_size=32,
    multiple_of=16,
    max_seq_len=64,
    tie_embeddings=True,
)


def write_hf(directory: Path, cfg: ModelConfig, dtype: torch.dtype, lm_head: bool = False) -> dict:
    """An HF directory of a freshly initialized model in `dtype` (`lm_head`: write the tied head too)."""
    from safetensors.torch import save_file

    model = Transformer(cfg)
    model.init_weights(0)
    tensors = {to_hf(k): v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_embeddings and not lm_head:
        del tensors["lm_head.weight"]
    elif cfg.tie_embeddings:
        tensors["lm_head.weight"] = tensors["lm_head.weight"].clone()  # safetensors refuses shared storage
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(hf_config(cfg)))
    save_file(tensors, str(directory / "model.safetensors"))
    return tensors


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def import_ok(hf_dir: Path, out: Path, *flags: str) -> Path:
    rc, _, err = run_cli(interop_main, "import-hf", hf_dir, "--out", out, *flags)
    assert rc == 0, err
    return out / "step_00000000"


@pytest.mark.parametrize("lm_head", [False, True])
def test_a_tied_embedding_is_stored_once(lm_head: bool, tmp_path: Path) -> None:
    source = write_hf(tmp_path / "hf", TIED, torch.float32, lm_head=lm_head)
    step = import_ok(tmp_path / "hf", tmp_path / "ckpt")
    meta = model_tensor_meta(step)
    assert "output.weight" not in meta and "tok_embeddings.weight" in meta
    tensors = load_model_tensors(step, list(with_tied_output(meta, True)))  # the tie: the same tensor
    assert tensors["output.weight"] is tensors["tok_embeddings.weight"]
    assert torch.equal(bits(tensors["tok_embeddings.weight"]), bits(source["model.embed_tokens.weight"]))
    model, _ = load_checkpoint_model(step)  # generation's loader
    assert model.output.weight is model.tok_embeddings.weight
    assert torch.equal(bits(model.output.weight.detach()), bits(source["model.embed_tokens.weight"]))
    assert precheck_init_from(step, TIED) == step
    fresh = Transformer(TIED)
    load_init_weights(fresh, step)
    assert torch.equal(bits(fresh.output.weight.detach()), bits(source["model.embed_tokens.weight"]))


def test_default_keeps_the_source_dtype_and_dtype_converts(tmp_path: Path) -> None:
    cfg = dataclasses.replace(TIED, tie_embeddings=False)
    source = write_hf(tmp_path / "hf", cfg, torch.bfloat16)
    kept = import_ok(tmp_path / "hf", tmp_path / "kept")
    assert {m.dtype for m in model_tensor_meta(kept).values()} == {torch.bfloat16}
    widened = import_ok(tmp_path / "hf", tmp_path / "wide", "--dtype", "fp32")
    assert {m.dtype for m in model_tensor_meta(widened).values()} == {torch.float32}
    for fqn, tensor in load_model_tensors(kept).items():
        assert torch.equal(bits(tensor), bits(source[to_hf(fqn)])), fqn
    for fqn, tensor in load_model_tensors(widened).items():
        assert torch.equal(bits(tensor), bits(source[to_hf(fqn)].float())), fqn


def test_fp32_source_narrowed_to_bf16_rounds_as_torch_does(tmp_path: Path) -> None:
    source = write_hf(tmp_path / "hf", TIED, torch.float32)
    step = import_ok(tmp_path / "hf", tmp_path / "ckpt", "--dtype", "bf16")
    for fqn, tensor in load_model_tensors(step).items():  # as stored: the embedding alone
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(
            bits(tensor),
            bits(
                source[to_hf(fqn if fqn != "output.weight" else "tok_embeddings.weight")].to(torch.bfloat16)
            ),
        ), fqn


def test_a_tied_stored_once_checkpoint_exports_and_reimports_bitwise(tmp_path: Path) -> None:
    source = write_hf(tmp_path / "hf", TIED, torch.float32)
    step = import_ok(tmp_path / "hf", tmp_path / "ckpt")
    rc, _, err = run_cli(interop_main, "export", step, "--to", "hf", tmp_path / "out", "--no-tokenizer")
    assert rc == 0, err
    from safetensors.torch import load_file

    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(back) == set(source)
    for name, tensor in back.items():
        assert torch.equal(bits(tensor), bits(source[name])), name


def test_a_bad_dtype_is_a_usage_error(tmp_path: Path) -> None:
    write_hf(tmp_path / "hf", TIED, torch.float32)
    rc, _, err = run_cli(
        interop_main, "import-hf", tmp_path / "hf", "--out", tmp_path / "c", "--dtype", "fp8"
    )
    assert rc == 2 and "invalid choice" in err


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_the_streaming_writer_lets_each_tensor_go_before_producing_the_next(tmp_path: Path) -> None:
    """What keeps import's memory flat whatever the model size: when the writer asks for a tensor, none
    it was given before the last one is still alive (DCP keeps a file's tensors until the file is closed,
    so one file for all of them would hold the whole model; the last one is still bound in its loop)."""
    import gc
    import weakref

    from truestep.checkpoint.weights_only import write_weights_checkpoint

    model = Transformer(TIED)
    model.init_weights(0)
    real = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "output.weight"}
    given: list[weakref.ref] = []
    alive_when_asked: list[str] = []

    def produce(fqn: str) -> torch.Tensor:
        gc.collect()
        alive_when_asked.extend(fqn for ref in given[:-1] if ref() is not None)  # the last: DCP's locals
        memory = real[fqn].numpy().copy()  # the storage's owner: a weakref to a tensor object would
        given.append(weakref.ref(memory))  # not see the storage outlive it under another tensor object
        return torch.from_numpy(memory)

    templates = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in real.items()}
    step = write_weights_checkpoint(tmp_path / "ckpt", templates, TIED, {"type": "test"}, produce=produce)
    assert len(given) == len(real) and alive_when_asked == []
    loaded = load_model_tensors(step, fqns=sorted(real))
    assert all(torch.equal(bits(loaded[k]), bits(real[k])) for k in real)
