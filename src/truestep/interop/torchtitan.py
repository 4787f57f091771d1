"""torchtitan llama3 DCP checkpoints -> truestep checkpoints.

torchtitan's llama3 names its parameters exactly as truestep does (`tok_embeddings.weight`,
`layers.0.attention.wq.weight`, ...) but rotates *interleaved* pairs of each head's dimensions (2j, 2j+1)
by RoPE (a complex multiplication), where truestep, like Hugging Face, rotates dimension j with
j + head_dim/2. Copying by name would give a different model without any error. Reordering the rows of
wq and wk inside every head as (0, 2, 4, ..., 1, 3, 5, ...) turns one layout into the other: q and k get
the same permutation, so every q.k score is unchanged; v and wo are untouched.

A torchtitan checkpoint records no model config, so the caller gives one and every stored shape is
checked against it before a byte of weights is read. The model keys are found flat (the layout
torchtitan writes) or under a `model.` prefix; optimizer, scheduler, data-loader and train-state
entries are never read (the last are pickles). `.metadata` goes through truestep's safe reader.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from truestep.checkpoint.catalog import DCP_METADATA
from truestep.checkpoint.errors import CheckpointContentError, TensorMismatchError
from truestep.checkpoint.safe_dcp import load_dcp, read_dcp_metadata
from truestep.checkpoint.weights import (
    TensorMeta,
    WeightsError,
    allocate,
    expected_shapes,
    layer_count_problem,
    model_overrides,
    problem_list,
    shape_problems,
)
from truestep.checkpoint.weights_only import write_weights_checkpoint
from truestep.config.schema import ModelConfig
from truestep.interop.errors import InteropError
from truestep.interop.hf_config import SPECIAL_TOKEN_KEYS
from truestep.model.rope import head_dim

# What a model key of a torchtitan llama looks like; anything else in the checkpoint is not model state.
_MODEL_KEY = re.compile(r"^(tok_embeddings\.|norm\.|output\.|layers\.\d+\.|freqs_cis$)")
_ROTATED = re.compile(r"^layers\.\d+\.attention\.(wq|wk)\.weight$")


def interleaved_to_half_split(weight: torch.Tensor, n_heads: int, width: int) -> torch.Tensor:
    """Rows of a q/k projection (n_heads * width, dim) reordered from interleaved RoPE pairs to halves."""
    rows, cols = weight.shape
    if rows != n_heads * width or width % 2:
        raise InteropError(f"cannot permute a [{rows}, {cols}] projection as {n_heads} heads of {width}")
    return weight.reshape(n_heads, width // 2, 2, cols).transpose(1, 2).reshape(rows, cols).contiguous()


def torchtitan_model_meta(dcp_dir: Path) -> tuple[str, dict[str, TensorMeta]]:
    """(key prefix, {truestep FQN: stored shape and dtype}) of the model tensors of a torchtitan DCP dir."""
    try:
        metadata = read_dcp_metadata(dcp_dir)
    except CheckpointContentError as err:
        raise InteropError(f"{dcp_dir}: {err}") from err
    except OSError as err:
        raise InteropError(
            f"{dcp_dir}: not a DCP checkpoint directory (cannot read {DCP_METADATA}: {err.strerror or err})"
        ) from err
    keys = metadata.state_dict_metadata
    if "tok_embeddings.weight" in keys:
        prefix = ""
    elif "model.tok_embeddings.weight" in keys:
        prefix = "model."
    else:
        raise InteropError(
            f"{dcp_dir}: no tok_embeddings.weight (flat or under model.): not a torchtitan llama checkpoint"
        )
    found = {}
    for key, item in keys.items():
        name = key[len(prefix) :] if key.startswith(prefix) else None
        if name is None or not _MODEL_KEY.match(name) or name == "freqs_cis":  # freqs_cis: derived RoPE table
            continue
        if not isinstance(item, TensorStorageMetadata):
            raise InteropError(f"{dcp_dir}: model entry {key} is not a tensor")
        found[name] = TensorMeta(tuple(item.size), item.properties.dtype)
    return prefix, found


def import_torchtitan(dcp_dir: Path, out: Path, cfg: ModelConfig) -> dict[str, Any]:
    """Write the model weights of a torchtitan llama3 DCP checkpoint, q/k permuted to truestep's RoPE
    layout, as a weights-only truestep checkpoint (fp32) for `cfg`."""
    dcp_dir = Path(dcp_dir)
    if not (dcp_dir / DCP_METADATA).exists():
        raise InteropError(
            f"{dcp_dir}: no {DCP_METADATA}; give the step directory of a torchtitan DCP checkpoint"
        )
    prefix, meta = torchtitan_model_meta(dcp_dir)
    layers = layer_count_problem(meta, cfg.n_layers, "torchtitan checkpoint", "the configured model expects")
    if layers:
        raise InteropError(f"{dcp_dir}: the stored weights do not fit the configured model: {layers}")
    try:
        expected = expected_shapes(cfg)
    except WeightsError as err:
        raise InteropError(f"the configured model: {err}") from None
    if cfg.tie_embeddings and "output.weight" not in meta:
        expected = {k: v for k, v in expected.items() if k != "output.weight"}
    problems = shape_problems(
        meta, expected, stored="torchtitan checkpoint", wanted="the configured model expects"
    )
    if problems:
        raise InteropError(
            f"{dcp_dir}: the stored weights do not fit the configured model: {problem_list(problems)}. "
            "Set the model with a preset/TOML and --model.* overrides (e.g. llama3.1-8b for torchtitan's 8B)"
        )
    try:
        tensors = allocate(meta, list(meta), dcp_dir)
        load_dcp({prefix + fqn: t for fqn, t in tensors.items()}, dcp_dir, no_dist=True)
    except (WeightsError, CheckpointContentError, TensorMismatchError) as err:
        raise InteropError(f"{dcp_dir}: {err}") from err
    except (RuntimeError, ValueError, KeyError) as err:
        raise InteropError(f"{dcp_dir}: the weights do not load: {type(err).__name__}: {err}") from err
    width = head_dim(cfg)
    state = {}
    for fqn, tensor in tensors.items():
        value = tensor.to(torch.float32)
        if _ROTATED.match(fqn):
            heads = cfg.n_heads if fqn.endswith("wq.weight") else (cfg.n_kv_heads or cfg.n_heads)
            value = interleaved_to_half_split(value, heads, width)
        state[fqn] = value.contiguous()
    if cfg.tie_embeddings:
        if "output.weight" in state and not torch.equal(
            state["output.weight"], state["tok_embeddings.weight"]
        ):
            raise InteropError(
                f"{dcp_dir}: output.weight differs from tok_embeddings.weight, so the model is not tied; "
                "set --model.tie_embeddings=false"
            )
        state["output.weight"] = state["tok_embeddings.weight"]
    source = {
        "type": "torchtitan",
        "path": str(dcp_dir.resolve()),
        "key_prefix": prefix,
        "dtypes": sorted({str(m.dtype).removeprefix("torch.") for m in meta.values()}),
        "rope": "interleaved pairs -> half-split (q/k rows permuted per head)",
    }
    no_tokenizer = {"files": [], **dict.fromkeys(SPECIAL_TOKEN_KEYS)}
    step_dir = write_weights_checkpoint(Path(out), state, cfg, source, extra_info={"tokenizer": no_tokenizer})
    return {
        "dcp_dir": str(dcp_dir),
        "checkpoint": str(step_dir),
        "tensors": len(state),
        "key_prefix": prefix,
        "source_dtypes": source["dtypes"],
        "model_overrides": model_overrides(cfg),
    }
