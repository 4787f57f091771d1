"""Hugging Face Llama directories <-> truestep checkpoints.

Export writes `config.json` (LlamaForCausalLM) and `model.safetensors`, or shards
`model-0000i-of-0000n.safetensors` with `model.safetensors.index.json` above `max_shard_size`.
Import reads such a directory (safetensors only: pickled `.bin` weights are refused) into a weights-only
truestep checkpoint. Neither direction needs `transformers`; both need `safetensors`.
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
    model_overrides,
    model_tensor_meta,
    read_model_config,
    shape_problems,
)
from truestep.checkpoint.weights_only import write_weights_checkpoint
from truestep.config.schema import ModelConfig
from truestep.core.fsio import atomic_write, new_staging_dir, publish_dir
from truestep.data.errors import DataError
from truestep.data.tokenizer import HFTokenizer
from truestep.data.tokenizer_files import TOKENIZER_FILES, TOKENIZER_JSON
from truestep.interop.dtypes import cast_for_export, dtype_name
from truestep.interop.errors import InteropError
from truestep.interop.hf_config import (
    ARCHITECTURE,
    CONFIG,
    ffn_rule_for,
    hf_config,
    model_config_from_hf,
    special_token_ids,
)
from truestep.interop.names import from_hf, sort_key, to_hf
from truestep.interop.tokenizer_export import (
    GENERATION_CONFIG,
    check_tokenizer_fits,
    checkpoint_tokenizer,
    generation_config,
    write_tokenizer,
)
from truestep.model.llama import ffn_hidden_dim

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
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


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError as err:
        raise InteropError(
            "Hugging Face interop needs the safetensors package: pip install 'truestep[hf]'"
        ) from err
    return safetensors


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
    into the directory too unless `with_tokenizer` is False. Reads one output shard's tensors at a time,
    so peak memory is about one shard, not the model.
    """
    st = _safetensors()
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
            loaded = load_model_tensors(ckpt_dir, shard.fqns, meta)
            tensors = {to_hf(fqn): cast_for_export(t, dtype, fqn) for fqn, t in loaded.items()}
            st.torch.save_file(tensors, str(staging / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, name))
            del loaded, tensors
        total = sum(s.nbytes for s in shards)
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            atomic_write(staging / INDEX_FILE, json.dumps(index, indent=2).encode())
        special = tok.special_tokens if tok is not None else None
        config = hf_config(cfg, dtype_name(dtype), special)
        atomic_write(staging / CONFIG, json.dumps(config, indent=2).encode())
        tokenizer_files = []
        if tok is not None:
            tokenizer_files = write_tokenizer(tok, staging)
            atomic_write(staging / GENERATION_CONFIG, json.dumps(generation_config(tok), indent=2).encode())
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


# ----------------------------------------------------------------------------------------------
# import


def _weight_files(hf_dir: Path) -> list[Path]:
    index = hf_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise InteropError(f"{index}: not a safetensors index: {err}") from err
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (hf_dir / f).is_file()]
        if missing:
            raise InteropError(f"{index} names missing files: {', '.join(missing[:5])}")
        return [hf_dir / f for f in files]
    if (hf_dir / SINGLE_FILE).is_file():
        return [hf_dir / SINGLE_FILE]
    if any(hf_dir.glob("*.bin")) or any(hf_dir.glob("*.pt")) or any(hf_dir.glob("*.pth")):
        raise InteropError(
            f"{hf_dir} holds only pickled weights (.bin/.pt): only safetensors are imported, since loading "
            "a pickle can run code; convert with transformers (save_pretrained(..., safe_serialization=True))"
        )
    raise InteropError(f"{hf_dir}: no {SINGLE_FILE} or {INDEX_FILE}")


def _read_hf_tensors(files: list[Path]) -> tuple[dict[str, torch.Tensor], list[str], set[str]]:
    st = _safetensors()
    tensors: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    dtypes: set[str] = set()
    for path in files:
        with st.safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                fqn = from_hf(name)
                if fqn is None:
                    if not name.endswith("rotary_emb.inv_freq"):  # a derived buffer some old exports carry
                        unknown.append(name)
                    continue
                tensor = handle.get_tensor(name)
                dtypes.add(str(tensor.dtype).removeprefix("torch."))
                tensors[fqn] = tensor
    return tensors, unknown, dtypes


def _special_tokens(hf: dict[str, Any], hf_dir: Path, vocab_size: int) -> dict[str, Any]:
    """bos/eos/pad ids of config.json, completed from generation_config.json where config.json has none."""
    found = special_token_ids(hf, vocab_size, str(hf_dir / CONFIG))
    generation = hf_dir / GENERATION_CONFIG
    if generation.is_file() and any(value is None for value in found.values()):
        try:
            extra = json.loads(generation.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InteropError(f"{generation}: not valid JSON: {err}") from err
        if not isinstance(extra, dict):
            raise InteropError(f"{generation} is not a JSON object")
        more = special_token_ids(extra, vocab_size, str(generation))
        found = {key: found[key] if found[key] is not None else more[key] for key in found}
    return found


def _tokenizer_files(hf_dir: Path, special: dict[str, Any]) -> dict[str, bytes]:
    """The tokenizer files of an HF directory (none without a tokenizer.json), checked to load."""
    if not (hf_dir / TOKENIZER_JSON).is_file():
        return {}
    eos = special.get("eos_token_id")
    try:
        HFTokenizer(hf_dir / TOKENIZER_JSON, eos_id=(eos[0] if isinstance(eos, list) else eos))
    except DataError as err:
        raise InteropError(
            f"{hf_dir}: {err}; remove the tokenizer files to import the weights alone"
        ) from err
    return {name: (hf_dir / name).read_bytes() for name in TOKENIZER_FILES if (hf_dir / name).is_file()}


def import_hf(hf_dir: Path, out: Path) -> dict[str, Any]:
    """Write the weights of an HF Llama directory as a weights-only truestep checkpoint (fp32).

    The tokenizer files beside the weights are copied into the checkpoint (and covered by its manifest)
    and the bos/eos/pad ids recorded in interop.json, so an export gives them back.
    """
    hf_dir = Path(hf_dir)
    config_path = hf_dir / CONFIG
    if not config_path.is_file():
        raise InteropError(f"{hf_dir}: no {CONFIG}; not a Hugging Face model directory")
    try:
        hf = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InteropError(f"{config_path}: not valid JSON: {err}") from err
    cfg = model_config_from_hf(hf, str(config_path))
    special = _special_tokens(hf, hf_dir, cfg.vocab_size)
    tokenizer_files = _tokenizer_files(hf_dir, special)
    tensors, unknown, dtypes = _read_hf_tensors(_weight_files(hf_dir))
    if unknown:
        biases = [n for n in unknown if n.endswith(".bias")]
        what = (
            "bias tensors (biases are not supported)" if biases else "tensors truestep's Llama does not have"
        )
        raise InteropError(f"{hf_dir}: {what}: {', '.join(unknown[:8])}")
    if cfg.tie_embeddings:
        # transformers ties lm_head to embed_tokens and usually omits it from the files
        if "tok_embeddings.weight" in tensors:
            tensors["output.weight"] = tensors["tok_embeddings.weight"]
    elif "output.weight" not in tensors:
        raise InteropError(f"{hf_dir}: lm_head.weight missing although tie_word_embeddings is false")
    meta = {fqn: TensorMeta(tuple(t.shape), t.dtype) for fqn, t in tensors.items()}
    problems = shape_problems(meta, expected_shapes(cfg), to_hf, "safetensors", f"{CONFIG} implies")
    if problems:
        raise InteropError(f"{hf_dir}: the weights do not match {CONFIG}:\n  " + "\n  ".join(problems[:20]))
    state = {fqn: t.to(torch.float32).contiguous() for fqn, t in tensors.items()}
    if cfg.tie_embeddings:
        state["output.weight"] = state["tok_embeddings.weight"]
    source = {
        "type": "huggingface",
        "path": str(hf_dir.resolve()),
        "architecture": ARCHITECTURE,
        "dtypes": sorted(dtypes),
        "config": hf,
    }
    record = {"files": list(tokenizer_files), **special}
    step_dir = write_weights_checkpoint(
        Path(out), state, cfg, source, extra_files=tokenizer_files, extra_info={"tokenizer": record}
    )
    n_params = sum(
        t.numel() for fqn, t in state.items() if not (cfg.tie_embeddings and fqn == "output.weight")
    )
    return {
        "hf_dir": str(hf_dir),
        "checkpoint": str(step_dir),
        "tensors": len(state),
        "parameters": n_params,
        "source_dtypes": sorted(dtypes),
        "model": cfg,
        "model_overrides": model_overrides(cfg),
        "tokenizer_files": list(tokenizer_files),
        "special_tokens": special,
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
