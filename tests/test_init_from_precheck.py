"""`checkpoint.init_from` is refused before the model is built (issue 28): the checkpoint's shapes are
compared with the configured model's on the meta device, so a misfit against a model far too large to
allocate is a one-line refusal naming the differing keys, not an allocation first."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from truestep.checkpoint.init_from import precheck_init_from
from truestep.checkpoint.resolver import CheckpointNotFound
from truestep.checkpoint.weights import WeightsError
from truestep.checkpoint.weights_only import write_weights_checkpoint
from truestep.config.schema import ModelConfig
from truestep.model.llama import Transformer

CFG = ModelConfig(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=32, multiple_of=16, max_seq_len=64)


@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory) -> Path:
    model = Transformer(CFG)
    model.init_weights(0)
    out = tmp_path_factory.mktemp("init") / "checkpoints"
    return write_weights_checkpoint(out, dict(model.state_dict()), CFG, {"type": "test"})


def test_a_fitting_config_passes(small_ckpt: Path) -> None:
    assert precheck_init_from(small_ckpt, CFG) == small_ckpt
    assert precheck_init_from(small_ckpt.parent, CFG) == small_ckpt  # a checkpoint root: newest


def test_a_model_too_large_to_allocate_is_refused_naming_the_keys(small_ckpt: Path) -> None:
    # 2**20 x 2**20 fp32 embeddings alone would be 4 TiB: only the meta device can describe this model.
    huge = dataclasses.replace(CFG, dim=2**20, n_heads=2**10, n_kv_heads=2**9, vocab_size=2**20)
    with pytest.raises(WeightsError) as info:
        precheck_init_from(small_ckpt, huge)
    line = str(info.value)
    assert "\n" not in line and f"checkpoint.init_from={small_ckpt} does not fit" in line
    assert "tok_embeddings.weight: checkpoint has [32, 16], model expects [1048576, 1048576]" in line
    assert "--model.dim=16" in line  # what the checkpoint needs


def test_a_wrong_layer_count_is_one_problem(small_ckpt: Path) -> None:
    with pytest.raises(WeightsError, match="the configured model has 100000 layers, the checkpoint holds 2"):
        precheck_init_from(small_ckpt, dataclasses.replace(CFG, n_layers=100000))


def test_a_tie_mismatch_is_refused(small_ckpt: Path) -> None:
    with pytest.raises(WeightsError, match="model.tie_embeddings: checkpoint False, configured True"):
        precheck_init_from(small_ckpt, dataclasses.replace(CFG, tie_embeddings=True))


def test_a_missing_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFound, match="checkpoint.init_from="):
        precheck_init_from(tmp_path / "nope", CFG)
