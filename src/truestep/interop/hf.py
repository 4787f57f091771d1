"""Hugging Face Llama directories <-> truestep checkpoints.

Export writes `config.json` (LlamaForCausalLM) and `model.safetensors`, or shards
`model-0000i-of-0000n.safetensors` with `model.safetensors.index.json` above `max_shard_size`, into a new
(or empty) directory, all at once (staged, then renamed into place). Import (`hf_import.py`) reads such a
directory (safetensors only: pickled `.bin` weights are refused) into a weights-only truestep
checkpoint. Neither direction needs `transformers`; both need `safetensors`.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from truestep.checkpoint.resolver import find_verified
from truestep.checkpoint.weights import (
    TensorMeta,
    check_config_fits,
    expected_shapes,
    load_model_tensors,
    model_tensor_meta,
    read_model_config,
)
from truestep.config.schema import ModelConfig
from truestep.core.fsio import atomic_write, new_staging_dir, publish_dir
from truestep.data.tokenizer_files import GENERATION_CONFIG
from truestep.interop.dtypes import cast_for_export, dtype_name
from truestep.interop.errors import InteropError
from truestep.interop.hf_config import CONFIG, ffn_rule_for, hf_config, model_config_from_hf
from truestep.interop.hf_import import (
    INDEX_FILE,
    SINGLE_FILE,
    import_hf,
    safetensors_failure,
    safetensors_module,
)
from truestep.interop.names import sort_key, to_hf
from truestep.interop.tokenizer_export import (
    check_tokenizer_fits,
    checkpoint_tokenizer,
    generation_config,
    write_tokenizer,
)
from truestep.model.llama import ffn_hidden_dim

DEFAULT_MAX_SHARD_SIZE = "5GB"

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(text: str | int) -> int:
    """Bytes in "5GB" (10**9, as transformers counts), "500MiB" (2**20), "1000" (bytes)."""
    if isinstance(text, int):
        size = text
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
        unit = match.group(2).upper() if match else None
        if match is None or unit not in _UNITS:
            raise InteropError(f"bad size {text!r}: use e.g. 5GB, 500MB, 2GiB or a byte count")
        size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise InteropError(f"size must be positive, got {text!r}")
    return size


# ----------------------------------------------------------------------------------------------
# export


@dataclass
class _Shard:
    fqns: list[str]
    nbytes: int = 0


def plan_shards(
    meta: dict[str, TensorMeta], fqns: list[str], max_bytes: int, dtype: torch.dtype = torch.float32
) -> list[_Shard]:
    """Greedy, in order, as transformers does: a new shard when the next tensor would overflow it."""
    shards = [_Shard([])]
    for fqn in fqns:
        nbytes = TensorMeta(meta[fqn].shape, dtype).nbytes
        if shards[-1].fqns and shards[-1].nbytes + nbytes > max_bytes:
            shards.append(_Shard([]))
        shards[-1].fqns.append(fqn)
        shards[-1].nbytes += nbytes
    return shards


def export_hf(
    ckpt: Path,
    out_dir: Path,
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
    checksums: bool = True,
    dtype: torch.dtype = torch.float32,
    data_dir: Path | None = None,
    with_tokenizer: bool = True,
) -> dict[str, Any]:
    """Consolidate a verified truestep checkpoint (any layout) into an HF Llama directory.

    Weights are written in `dtype`; the tokenizer (see `tokenizer_export`) and its special-token ids go
    into the directory too unless `with_tokenizer` is False. Reads one stored tensor at a time and keeps
    only its cast copy until its shard is written, so peak memory is about one output shard plus one
    stored tensor, not the model.
    """
    st = safetensors_module()
    max_bytes = parse_size(max_shard_size)
    ckpt_dir = find_verified(Path(ckpt), checksums)
    cfg = read_model_config(ckpt_dir)
    meta = model_tensor_meta(ckpt_dir)
    check_config_fits(ckpt_dir, cfg, meta)
    tok = checkpoint_tokenizer(ckpt_dir, data_dir) if with_tokenizer else None
    if tok is not None:
        check_tokenizer_fits(tok, cfg)
    fqns = sorted(meta, key=sort_key)
    if cfg.tie_embeddings:
        fqns = [f for f in fqns if f != "output.weight"]  # HF ties lm_head to embed_tokens itself
    shards = plan_shards(meta, fqns, max_bytes, dtype)
    out_dir = Path(out_dir)
    staging = new_staging_dir(out_dir, "an export")
    try:
        names = (
            [SINGLE_FILE]
            if len(shards) == 1
            else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
        )
        weight_map: dict[str, str] = {}
        for shard, name in zip(shards, names, strict=True):
            tensors = {}
            for fqn in shard.fqns:  # one stored tensor at a time: peak ~ this shard + one tensor
                loaded = load_model_tensors(ckpt_dir, [fqn], meta)[fqn]
                tensors[to_hf(fqn)] = cast_for_export(loaded, dtype, fqn)
                del loaded
            try:
                st.torch.save_file(tensors, str(staging / name), metadata={"format": "pt"})
            except Exception as err:  # SafetensorError: "I/O error: No space left on device (os error 28)"
                raise safetensors_failure(err, out_dir / name, "writing failed") from err
            weight_map.update(dict.fromkeys(tensors, name))
            del tensors
        total = sum(s.nbytes for s in shards)
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            atomic_write(staging / INDEX_FILE, json.dumps(index, indent=2, allow_nan=False).encode())
        special = tok.special_tokens if tok is not None else None
        config = hf_config(cfg, dtype_name(dtype), special)
        atomic_write(staging / CONFIG, json.dumps(config, indent=2, allow_nan=False).encode())
        tokenizer_files = []
        if tok is not None:
            tokenizer_files = write_tokenizer(tok, staging)
            atomic_write(
                staging / GENERATION_CONFIG,
                json.dumps(generation_config(tok), indent=2, allow_nan=False).encode(),
            )
        publish_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "checkpoint": str(ckpt_dir),
        "out": str(out_dir),
        "files": names,
        "tensors": len(weight_map),
        "bytes": total,
        "dtype": dtype_name(dtype),
        "tokenizer": tok.source if tok is not None else None,
        "tokenizer_files": tokenizer_files,
    }


def describe_model(cfg: ModelConfig) -> str:
    params = sum(
        math.prod(s)
        for f, s in expected_shapes(cfg).items()
        if not (cfg.tie_embeddings and f == "output.weight")
    )
    return (
        f"dim={cfg.dim} layers={cfg.n_layers} heads={cfg.n_heads}/{cfg.n_kv_heads or cfg.n_heads} "
        f"ffn={ffn_hidden_dim(cfg)} vocab={cfg.vocab_size} params={params:,}"
    )


__all__ = [
    "DEFAULT_MAX_SHARD_SIZE",
    "describe_model",
    "export_hf",
    "ffn_rule_for",
    "hf_config",
    "import_hf",
    "model_config_from_hf",
    "parse_size",
]
