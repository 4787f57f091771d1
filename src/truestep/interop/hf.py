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
from truestep.interop.errors import InteropError
from truestep.interop.names import from_hf, sort_key, to_hf
from truestep.model.llama import ffn_hidden_dim

ARCHITECTURE = "LlamaForCausalLM"
CONFIG = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_SIZE = "5GB"

# Defaults LlamaConfig applies to keys a config.json leaves out.
HF_DEFAULTS = {
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
}

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
# configs


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for LlamaForCausalLM, readable by transformers 4.x (rope_theta) and 5.x (rope_parameters)."""
    n_kv = cfg.n_kv_heads or cfg.n_heads
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": cfg.dim,
        "intermediate_size": ffn_hidden_dim(cfg),
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": cfg.dim // cfg.n_heads,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": cfg.init_std,
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }


def ffn_rule_for(dim: int, intermediate: int) -> tuple[int, float]:
    """(multiple_of, ffn_dim_multiplier) with ffn_hidden_dim == intermediate, preferring round values."""
    base = int(2 * (4 * dim) / 3)
    multipliers = [0.0] + sorted({round(intermediate / base, digits) for digits in (1, 2, 3, 4)})
    candidates = [1024, 256, 4096, 2048, 512, 128, 64, 32, 16, 8, 4, 2, 1]  # Llama 3, Llama 2 first
    for multiplier in multipliers:
        for multiple_of in candidates:
            probe = ModelConfig(dim=dim, multiple_of=multiple_of, ffn_dim_multiplier=multiplier)
            if ffn_hidden_dim(probe) == intermediate:
                return multiple_of, multiplier
    # Always reachable: round up to a multiple of the size itself from anything in (0, intermediate].
    multiplier = intermediate / base
    probe = ModelConfig(dim=dim, multiple_of=intermediate, ffn_dim_multiplier=multiplier)
    if ffn_hidden_dim(probe) != intermediate:  # pragma: no cover - float rounding beyond belief
        raise InteropError(f"cannot express intermediate_size={intermediate} with truestep's FFN rule")
    return intermediate, multiplier


def _rope_theta(hf: dict[str, Any], problems: list[str]) -> float:
    scaling = hf.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type", "?")) if isinstance(scaling, dict) else "?"
        problems.append(
            f"rope_scaling is set ({kind!r}): RoPE scaling (llama3, linear, dynamic, yarn, ...) is not "
            "supported; truestep implements only plain RoPE"
        )
    theta = hf.get("rope_theta")
    params = hf.get("rope_parameters")
    if params:
        if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
            problems.append("rope_parameters per layer type are not supported")
            return float(theta or HF_DEFAULTS["rope_theta"])
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            problems.append(
                f"rope_parameters.rope_type={kind!r} (RoPE scaling) is not supported; only 'default'"
            )
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            problems.append("partial_rotary_factor != 1 is not supported")
        theta = params.get("rope_theta", theta)
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append("partial_rotary_factor != 1 is not supported")
    return float(theta if theta is not None else HF_DEFAULTS["rope_theta"])


def model_config_from_hf(hf: Any, where: str = CONFIG) -> ModelConfig:
    """The truestep ModelConfig equivalent to an HF Llama config.json; InteropError listing every problem."""
    if not isinstance(hf, dict):
        raise InteropError(f"{where} is not a JSON object")
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    known = archs == [ARCHITECTURE] or (not archs and model_type == "llama")
    if not known or model_type not in (None, "llama"):
        found = ", ".join(map(str, archs)) or f"model_type={model_type!r}"
        raise InteropError(
            f"{where}: unsupported architecture {found}; only {ARCHITECTURE} (model_type 'llama') is supported"
        )
    problems: list[str] = []
    required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    missing = [key for key in required if not isinstance(hf.get(key), int) or hf[key] <= 0]
    if missing:
        raise InteropError(f"{where}: missing or invalid {', '.join(missing)}")

    def get(key: str) -> Any:
        return hf[key] if hf.get(key) is not None else HF_DEFAULTS[key]

    dim, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    n_kv = hf.get("num_key_value_heads") or n_heads
    if hf.get("attention_bias") or hf.get("mlp_bias") or hf.get("bias"):
        problems.append("attention_bias/mlp_bias are set: biases are not supported (truestep Llama has none)")
    if get("hidden_act") not in ("silu", "swish"):
        problems.append(f"hidden_act={hf.get('hidden_act')!r} is not supported; only silu (SwiGLU)")
    if dim % n_heads:
        problems.append(f"hidden_size={dim} is not divisible by num_attention_heads={n_heads}")
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim != dim // n_heads:
        problems.append(
            f"head_dim={head_dim} != hidden_size/num_attention_heads={dim // n_heads}: truestep derives the "
            "head size from dim/n_heads, so a decoupled head_dim is not supported"
        )
    if (dim // n_heads) % 2:
        problems.append(f"head size {dim // n_heads} is odd; RoPE needs an even head size")
    if n_heads % n_kv:
        problems.append(f"num_attention_heads={n_heads} is not a multiple of num_key_value_heads={n_kv}")
    if hf.get("quantization_config"):
        problems.append("quantized checkpoints (quantization_config) are not supported")
    theta = _rope_theta(hf, problems)
    if problems:
        raise InteropError(f"{where}: cannot import this Llama config:\n  " + "\n  ".join(problems))
    multiple_of, multiplier = ffn_rule_for(dim, hf["intermediate_size"])
    return ModelConfig(
        dim=dim,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=n_kv,
        vocab_size=hf["vocab_size"],
        multiple_of=multiple_of,
        ffn_dim_multiplier=multiplier,
        norm_eps=float(get("rms_norm_eps")),
        rope_theta=theta,
        max_seq_len=int(get("max_position_embeddings")),
        tie_embeddings=bool(get("tie_word_embeddings")),
        init_std=float(hf.get("initializer_range") or ModelConfig.init_std),
    )


# ----------------------------------------------------------------------------------------------
# export


@dataclass
class _Shard:
    fqns: list[str]
    nbytes: int = 0


def plan_shards(meta: dict[str, TensorMeta], fqns: list[str], max_bytes: int) -> list[_Shard]:
    """Greedy, in order, as transformers does: a new shard when the next tensor would overflow it."""
    shards = [_Shard([])]
    for fqn in fqns:
        nbytes = TensorMeta(meta[fqn].shape, torch.float32).nbytes
        if shards[-1].fqns and shards[-1].nbytes + nbytes > max_bytes:
            shards.append(_Shard([]))
        shards[-1].fqns.append(fqn)
        shards[-1].nbytes += nbytes
    return shards


def export_hf(
    ckpt: Path, out_dir: Path, max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE, checksums: bool = True
) -> dict[str, Any]:
    """Consolidate a verified truestep checkpoint (any layout) into an HF Llama directory (fp32).

    Reads one output shard's tensors at a time, so peak memory is about one shard, not the model.
    """
    st = _safetensors()
    max_bytes = parse_size(max_shard_size)
    ckpt_dir = find_verified(Path(ckpt), checksums)
    cfg = read_model_config(ckpt_dir)
    meta = model_tensor_meta(ckpt_dir)
    check_config_fits(ckpt_dir, cfg, meta)
    fqns = sorted(meta, key=sort_key)
    if cfg.tie_embeddings:
        fqns = [f for f in fqns if f != "output.weight"]  # HF ties lm_head to embed_tokens itself
    shards = plan_shards(meta, fqns, max_bytes)
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
            tensors = {to_hf(fqn): t.to(torch.float32).contiguous() for fqn, t in loaded.items()}
            st.torch.save_file(tensors, str(staging / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, name))
            del loaded, tensors
        total = sum(s.nbytes for s in shards)
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            atomic_write(staging / INDEX_FILE, json.dumps(index, indent=2).encode())
        atomic_write(staging / CONFIG, json.dumps(hf_config(cfg), indent=2).encode())
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


def import_hf(hf_dir: Path, out: Path) -> dict[str, Any]:
    """Write the weights of an HF Llama directory as a weights-only truestep checkpoint (fp32)."""
    hf_dir = Path(hf_dir)
    config_path = hf_dir / CONFIG
    if not config_path.is_file():
        raise InteropError(f"{hf_dir}: no {CONFIG}; not a Hugging Face model directory")
    try:
        hf = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InteropError(f"{config_path}: not valid JSON: {err}") from err
    cfg = model_config_from_hf(hf, str(config_path))
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
    step_dir = write_weights_checkpoint(Path(out), state, cfg, source)
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
