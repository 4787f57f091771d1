"""Hugging Face Llama `config.json` <-> truestep `ModelConfig`, and the special-token ids it carries.

Written for transformers 4.x (`rope_theta` + `rope_scaling`) and 5.x (`rope_parameters`) alike; read from
either. Everything truestep's Llama cannot compute exactly is refused with the reason, never approximated.
"""

from __future__ import annotations

from typing import Any

from truestep.config.errors import ConfigError
from truestep.config.schema import ModelConfig
from truestep.config.validate import validate_model
from truestep.interop.errors import InteropError
from truestep.model.llama import ffn_hidden_dim
from truestep.model.rope import head_dim

ARCHITECTURE = "LlamaForCausalLM"
MISTRAL = "MistralForCausalLM"
FAMILIES = {"llama": (ARCHITECTURE, "llama"), "mistral": (MISTRAL, "mistral")}
"""Architectures that compute exactly what truestep's Llama computes (Mistral: when no sliding window
binds); exports are written as LlamaForCausalLM, the same function."""
CONFIG = "config.json"
SPECIAL_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")

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
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope_entries(cfg: ModelConfig) -> dict[str, Any]:
    if cfg.rope_scaling == "none":
        return {"rope_type": "default"}
    if cfg.rope_scaling == "linear":
        return {"rope_type": "linear", "factor": cfg.rope_scaling_factor}
    return {
        "rope_type": "llama3",
        "factor": cfg.rope_scaling_factor,
        "low_freq_factor": cfg.rope_low_freq_factor,
        "high_freq_factor": cfg.rope_high_freq_factor,
        "original_max_position_embeddings": cfg.rope_original_max_seq_len,
    }


def hf_config(
    cfg: ModelConfig, torch_dtype: str = "float32", special_tokens: dict[str, Any] | None = None
) -> dict[str, Any]:
    """config.json for LlamaForCausalLM, readable by transformers 4.x (rope_theta, rope_scaling) and 5.x
    (rope_parameters). `special_tokens` holds bos/eos/pad_token_id (null when not given)."""
    n_kv = cfg.n_kv_heads or cfg.n_heads
    rope = _rope_entries(cfg)
    tokens = special_tokens or {}
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": cfg.dim,
        "intermediate_size": ffn_hidden_dim(cfg),
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim(cfg),
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": rope if rope["rope_type"] != "default" else None,
        "rope_parameters": {**rope, "rope_theta": cfg.rope_theta},
        "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": torch_dtype,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": cfg.init_std,
        "pretraining_tp": 1,
        "use_cache": True,
        **{key: tokens.get(key) for key in SPECIAL_TOKEN_KEYS},
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


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _llama3_fields(params: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    missing = [key for key in _LLAMA3_KEYS if not _number(params.get(key))]
    if missing:
        problems.append(f"{where}: llama3 RoPE scaling needs numeric {', '.join(missing)}")
        return {}
    fields = {
        "rope_scaling": "llama3",
        "rope_scaling_factor": float(params["factor"]),
        "rope_low_freq_factor": float(params["low_freq_factor"]),
        "rope_high_freq_factor": float(params["high_freq_factor"]),
        "rope_original_max_seq_len": int(params["original_max_position_embeddings"]),
    }
    if fields["rope_scaling_factor"] < 1:
        problems.append(f"{where}: factor={params['factor']} < 1")
    if not 0 < fields["rope_low_freq_factor"] < fields["rope_high_freq_factor"]:
        problems.append(f"{where}: need 0 < low_freq_factor < high_freq_factor")
    if fields["rope_original_max_seq_len"] <= 0:
        problems.append(f"{where}: original_max_position_embeddings must be positive")
    return fields


def _scaling_fields(params: Any, where: str, problems: list[str]) -> dict[str, Any]:
    """ModelConfig rope_* keys for one rope_scaling / rope_parameters table (none for default RoPE)."""
    if not params:
        return {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        problems.append(f"{where}: per-layer-type RoPE parameters are not supported")
        return {}
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append(f"{where}: partial_rotary_factor != 1 is not supported")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return {}
    if kind == "linear":
        if not _number(params.get("factor")) or params["factor"] < 1:
            problems.append(f"{where}: linear RoPE scaling needs a numeric factor >= 1")
            return {}
        return {"rope_scaling": "linear", "rope_scaling_factor": float(params["factor"])}
    if kind != "llama3":
        problems.append(
            f"{where}: rope_type={kind!r} is not supported; truestep implements plain RoPE, llama3 and "
            "linear scaling"
        )
        return {}
    return _llama3_fields(params, where, problems)


def _rope(hf: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """rope_theta and the rope_* scaling keys of an HF config (4.x or 5.x spelling)."""
    legacy = _scaling_fields(hf.get("rope_scaling"), "rope_scaling", problems)
    params = hf.get("rope_parameters")
    current = _scaling_fields(params, "rope_parameters", problems)
    if hf.get("rope_scaling") and params and legacy != current:
        problems.append("rope_scaling and rope_parameters describe different RoPE scalings")
    theta = hf.get("rope_theta")
    if isinstance(params, dict) and _number(params.get("rope_theta")):
        if theta is not None and theta != params["rope_theta"]:
            problems.append(
                f"rope_theta={theta} and rope_parameters.rope_theta={params['rope_theta']} differ"
            )
        theta = params["rope_theta"]
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append("partial_rotary_factor != 1 is not supported")
    return {
        "rope_theta": float(theta if theta is not None else HF_DEFAULTS["rope_theta"]),
        **(current or legacy),
    }


def _head_dim(hf: dict[str, Any], dim: int, n_heads: int, problems: list[str]) -> int:
    """The explicit head width to record: 0 when it is (or must be) dim / n_heads."""
    explicit = hf.get("head_dim")
    if explicit is None:
        if dim % n_heads:
            problems.append(
                f"hidden_size={dim} is not divisible by num_attention_heads={n_heads} and no head_dim"
            )
        width = dim // n_heads
    elif not isinstance(explicit, int) or isinstance(explicit, bool) or explicit <= 0:
        problems.append(f"head_dim={explicit!r} is not a positive integer")
        return 0
    else:
        width = explicit
    if width % 2:
        problems.append(f"head size {width} is odd; RoPE needs an even head size")
    return 0 if width * n_heads == dim else width


def special_token_ids(hf: dict[str, Any], vocab_size: int, where: str) -> dict[str, Any]:
    """bos/eos/pad_token_id of a config (eos may be a list, as in Llama 3 instruct models), range-checked."""
    found = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = hf.get(key)
        ids = value if isinstance(value, list) else [value]
        if value is None or (key == "eos_token_id" and isinstance(value, list) and not value):
            found[key] = None
            continue
        if key != "eos_token_id" and isinstance(value, list):
            raise InteropError(f"{where}: {key} must be one id, got {value!r}")
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ids):
            raise InteropError(f"{where}: {key}={value!r} is not an id below vocab_size {vocab_size}")
        found[key] = value
    return found


def _mistral_window(hf: dict[str, Any], problems: list[str]) -> None:
    """Mistral is Llama plus a sliding attention window; without one (v0.3) or with one no shorter than
    the context (it never binds), it is Llama."""
    window = hf.get("sliding_window")
    context = hf.get("max_position_embeddings") or HF_DEFAULTS["max_position_embeddings"]
    if window is None or (isinstance(window, int) and not isinstance(window, bool) and window >= context):
        return
    problems.append(
        f"sliding_window={window!r:.20} is shorter than max_position_embeddings={context!r:.20}: sliding-window "
        "attention is not supported (Mistral v0.1); Mistral v0.3 (sliding_window null) imports"
    )


def merged_eos(first: int | list[int] | None, second: int | list[int] | None) -> int | list[int] | None:
    """Every eos id of both, `first`'s first, each once; one id stays an int (as transformers writes it)."""
    ids: list[int] = []
    for value in (first, second):
        for i in value if isinstance(value, list) else [] if value is None else [value]:
            if i not in ids:
                ids.append(i)
    return None if not ids else ids[0] if len(ids) == 1 else ids


def model_config_from_hf(hf: Any, where: str = CONFIG) -> ModelConfig:
    """The truestep ModelConfig equivalent to an HF Llama config.json; InteropError listing every problem."""
    if not isinstance(hf, dict):
        raise InteropError(f"{where} is not a JSON object")
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    family = next((f for f, (arch, kind) in FAMILIES.items() if model_type == kind or archs == [arch]), None)
    known = (
        family is not None
        and archs in ([], [FAMILIES[family][0]])
        and model_type in (None, FAMILIES[family][1])
    )
    if not known:
        found = ", ".join(map(str, archs)) or f"model_type={model_type!r}"
        raise InteropError(
            f"{where}: unsupported architecture {found}; only {ARCHITECTURE} (model_type 'llama') and "
            f"{MISTRAL} without a binding sliding window are supported"
        )
    problems: list[str] = []
    if family == "mistral":
        _mistral_window(hf, problems)
    required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    missing = [
        key
        for key in required
        if not isinstance(hf.get(key), int) or isinstance(hf[key], bool) or hf[key] <= 0
    ]
    if missing:
        raise InteropError(f"{where}: missing or invalid {', '.join(missing)}")

    def get(key: str) -> Any:
        return hf[key] if hf.get(key) is not None else HF_DEFAULTS[key]

    wrong = [
        f"{key}={hf[key]!r:.40}"
        for key, kinds in (
            ("num_key_value_heads", int),
            ("rms_norm_eps", int | float),
            ("rope_theta", int | float),
            ("max_position_embeddings", int),
            ("initializer_range", int | float),
            ("tie_word_embeddings", bool),
        )
        if hf.get(key) is not None
        and (not isinstance(hf[key], kinds) or (kinds is not bool and isinstance(hf[key], bool)))
    ]
    if wrong:
        raise InteropError(f"{where}: values of the wrong type: {', '.join(wrong)}")

    dim, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    n_kv = hf.get("num_key_value_heads") or n_heads
    if hf.get("attention_bias") or hf.get("mlp_bias") or hf.get("bias"):
        problems.append(
            "attention_bias/mlp_bias are set: biases are not supported (no Llama checkpoint has them; "
            "see docs/interop.md)"
        )
    if get("hidden_act") not in ("silu", "swish"):
        problems.append(f"hidden_act={hf.get('hidden_act')!r} is not supported; only silu (SwiGLU)")
    width = _head_dim(hf, dim, n_heads, problems)
    if n_heads % n_kv:
        problems.append(f"num_attention_heads={n_heads} is not a multiple of num_key_value_heads={n_kv}")
    if hf.get("quantization_config"):
        problems.append("quantized checkpoints (quantization_config) are not supported")
    try:
        rope = _rope(hf, problems)
        if problems:
            raise InteropError(f"{where}: cannot import this Llama config: " + "; ".join(problems))
        multiple_of, multiplier = ffn_rule_for(dim, hf["intermediate_size"])
        cfg = ModelConfig(
            dim=dim,
            n_layers=hf["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=width,
            vocab_size=hf["vocab_size"],
            multiple_of=multiple_of,
            ffn_dim_multiplier=multiplier,
            norm_eps=float(get("rms_norm_eps")),
            max_seq_len=int(get("max_position_embeddings")),
            tie_embeddings=bool(get("tie_word_embeddings")),
            init_std=float(hf.get("initializer_range") or ModelConfig.init_std),
            **rope,
        )
    except (OverflowError, ValueError) as err:  # numbers beyond any float: not a model
        raise InteropError(f"{where}: a size or factor is out of range: {err}") from None
    try:
        validate_model(cfg)
    except ConfigError as err:  # named in truestep's terms: the keys the import would print as overrides
        raise InteropError(f"{where}: the model it describes is not valid: {err}") from None
    return cfg
