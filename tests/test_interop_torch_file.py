"""`export --to torch` round-trips through the documented load, for every model shape it accepts:
`Transformer(cfg).load_state_dict(torch.load(FILE, weights_only=True), strict=True)` gives back the
checkpoint's weights bit for bit, with tied embeddings (Llama 3.2's shape) and without, from a trained
checkpoint (a real run in this process) and from an imported one (`import-hf` stores a tied output
weight once, as the embedding: the export must name it again)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness import run_in_process
from interop_cases import cli, needs_safetensors
from truestep.checkpoint.catalog import step_dir_name
from truestep.checkpoint.weights import load_model_tensors, read_model_config
from truestep.config.schema import ModelConfig
from truestep.model.llama import Transformer


def trained(tmp_path: Path, tied: bool) -> Path:
    run = tmp_path / "run"
    code = run_in_process(
        run,
        f"--model.tie_embeddings={str(tied).lower()}",
        "--train.max_steps=2",
        "--checkpoint.interval=0",
        "--schedule.warmup_steps=1",
    )
    assert code == 0
    return run / "checkpoints" / step_dir_name(2)


def imported(tmp_path: Path, tied: bool) -> Path:
    from safetensors.torch import save_file

    from truestep.interop.hf import hf_config
    from truestep.interop.names import to_hf

    cfg = ModelConfig(
        dim=16, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=32, multiple_of=16, max_seq_len=64,
        tie_embeddings=tied,
    )  # fmt: skip
    source = tmp_path / "hf"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(hf_config(cfg)))
    model = Transformer(cfg)
    model.init_weights(0)
    weights = {to_hf(k): v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if tied:  # transformers omits the tied lm_head from the file
        del weights[to_hf("output.weight")]
    save_file(weights, str(source / "model.safetensors"))
    rc, _, err = cli("import-hf", source, "--out", tmp_path / "ckpt")
    assert rc == 0, err
    return tmp_path / "ckpt" / step_dir_name(0)


@needs_safetensors
@pytest.mark.parametrize("make", [trained, imported])
@pytest.mark.parametrize("tied", [True, False])
def test_export_torch_loads_strictly_tied_or_not(tmp_path: Path, tied: bool, make) -> None:
    ckpt = make(tmp_path, tied)
    file = tmp_path / "weights.pt"
    rc, _, err = cli("export", ckpt, "--to", "torch", file)
    assert rc == 0, err
    state = torch.load(file, weights_only=True)
    model = Transformer(read_model_config(ckpt))
    model.load_state_dict(state, strict=True)  # the documented load: no missing or unexpected key
    assert state.keys() == model.state_dict().keys()
    assert (model.output.weight is model.tok_embeddings.weight) is tied
    stored = load_model_tensors(ckpt)
    for name, value in model.state_dict().items():
        source = stored["tok_embeddings.weight"] if tied and name == "output.weight" else stored[name]
        assert torch.equal(value.view(torch.int32), source.view(torch.int32)), name  # bit patterns
    if tied:  # one tensor under two names, as in the module: the file holds the embedding once
        assert state["output.weight"].untyped_storage().data_ptr() == (
            state["tok_embeddings.weight"].untyped_storage().data_ptr()
        )
