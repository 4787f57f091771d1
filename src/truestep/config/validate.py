"""Config validation: every rule names the keys involved and how to fix them.

`validate` checks what does not depend on the world size; `validate_layout` checks the mesh against
the world size, and runs before any process-group work. `validate_model` is the model section's part on
its own: a model config read from a checkpoint or a Hugging Face `config.json` is held to the same rules
before anything is built from it.

Every float must be finite (`--optim.lr=inf` would train to a non-finite checkpoint) and every integer
must fit in 64 bits (torch and numpy take them as int64).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from truestep.config.errors import ConfigError
from truestep.config.schema import ACTIVATION_CHECKPOINTING, PREEMPTION_SIGNALS, JobConfig, ModelConfig
from truestep.core.errors import ExitCode

INT64_MAX = 2**63 - 1
MAX_SEQ_LEN = 1 << 20
"""Upper bound of model.max_seq_len (8x Llama 3.1's 128K): the RoPE tables are built for every position
(cos + sin, fp32, head_dim wide: 1 GiB at head_dim 128), so a larger value is a typo, not a model."""
MAX_FFN_MULTIPLIER = 64.0
"""Upper bound of model.ffn_dim_multiplier (Llama uses 1.3-1.5)."""
RESERVED_EXIT_CODES = {int(code) for code in ExitCode} - {int(ExitCode.REQUEUE), int(ExitCode.FORCED)}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_numbers(section: str, obj: Any) -> None:
    """Every float field finite, every int field within int64 (the names are `section.field`)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float):
            _require(math.isfinite(value), f"{section}.{f.name}={value} must be a finite number")
        elif isinstance(value, int) and not isinstance(value, bool):
            _require(abs(value) <= INT64_MAX, f"{section}.{f.name}={value} does not fit in 64 bits")


def validate_model(m: ModelConfig) -> None:
    """The rules of the model section alone (see the module docstring)."""
    _check_numbers("model", m)
    for name, value in (
        ("model.dim", m.dim),
        ("model.n_layers", m.n_layers),
        ("model.n_heads", m.n_heads),
        ("model.vocab_size", m.vocab_size),
        ("model.multiple_of", m.multiple_of),
        ("model.max_seq_len", m.max_seq_len),
    ):
        _require(value > 0, f"{name} must be positive, got {value}")
    _require(
        m.max_seq_len <= MAX_SEQ_LEN,
        f"model.max_seq_len={m.max_seq_len} is beyond {MAX_SEQ_LEN}: the RoPE tables cover every position "
        "(cos + sin in fp32); set the context length you train or generate at",
    )
    _require(m.head_dim >= 0, f"model.head_dim must be >= 0 (0 = dim / n_heads), got {m.head_dim}")
    _require(
        m.head_dim > 0 or m.dim % m.n_heads == 0,
        f"model.dim={m.dim} must be divisible by model.n_heads={m.n_heads}, or set model.head_dim",
    )
    kv = m.n_kv_heads or m.n_heads
    _require(
        m.n_kv_heads >= 0 and m.n_heads % kv == 0,
        f"model.n_heads={m.n_heads} must be a multiple of model.n_kv_heads={kv}",
    )
    head_dim = m.head_dim or m.dim // m.n_heads
    _require(
        head_dim % 2 == 0,
        f"the head width ({head_dim}; model.head_dim or dim / n_heads) must be even for RoPE",
    )
    _require(
        0 <= m.ffn_dim_multiplier <= MAX_FFN_MULTIPLIER,
        f"model.ffn_dim_multiplier must be in [0, {MAX_FFN_MULTIPLIER:g}] (0 = none), got {m.ffn_dim_multiplier}",
    )
    _require(m.rope_theta > 0, f"model.rope_theta must be positive (Llama 3: 500000), got {m.rope_theta}")
    _validate_rope_scaling(m)
    _require(0.0 <= m.dropout < 1.0, f"model.dropout must be in [0, 1), got {m.dropout}")
    _require(
        m.norm_eps > 0 and m.init_std > 0,
        f"model.norm_eps ({m.norm_eps}) and model.init_std ({m.init_std}) must be positive",
    )


def validate(cfg: JobConfig) -> None:
    m, p, d, t, o, s, c = (
        cfg.model,
        cfg.parallel,
        cfg.data,
        cfg.train,
        cfg.optim,
        cfg.schedule,
        cfg.checkpoint,
    )
    for f in dataclasses.fields(cfg):
        _check_numbers(f.name, getattr(cfg, f.name))
    validate_model(m)
    _require(cfg.run.dir.strip() != "", "run.dir must not be empty (it is where the run writes everything)")
    for name, value in (
        ("data.seq_len", d.seq_len),
        ("train.max_steps", t.max_steps),
        ("train.global_batch_size", t.global_batch_size),
        ("parallel.tp", p.tp),
        ("parallel.num_threads", p.num_threads),
    ):
        _require(value > 0, f"{name} must be positive, got {value}")
    kv = m.n_kv_heads or m.n_heads
    _require(
        d.seq_len <= m.max_seq_len,
        f"data.seq_len={d.seq_len} exceeds model.max_seq_len={m.max_seq_len}; raise max_seq_len",
    )
    _require(
        p.dp_shard == -1 or p.dp_shard > 0, f"parallel.dp_shard must be -1 or positive, got {p.dp_shard}"
    )
    _require(
        p.backend in ("auto", "gloo", "nccl"), f"parallel.backend must be auto|gloo|nccl, got {p.backend!r}"
    )
    _require(p.device in ("auto", "cpu", "cuda"), f"parallel.device must be auto|cpu|cuda, got {p.device!r}")
    _require(
        t.init_scheme in ("blockwise", "full"),
        f"train.init_scheme must be blockwise|full, got {t.init_scheme!r}",
    )
    _require(
        m.n_heads % p.tp == 0 and kv % p.tp == 0,
        f"parallel.tp={p.tp} must divide model.n_heads={m.n_heads} and model.n_kv_heads={kv}",
    )
    _require(
        m.vocab_size % p.tp == 0,
        f"parallel.tp={p.tp} must divide model.vocab_size={m.vocab_size} (embedding and output are sharded)",
    )
    _require(t.micro_batch_size >= 0, "train.micro_batch_size must be >= 0 (0 = no accumulation)")
    _require(
        t.activation_checkpointing in ACTIVATION_CHECKPOINTING,
        f"train.activation_checkpointing must be {'|'.join(ACTIVATION_CHECKPOINTING)}, got {t.activation_checkpointing!r}",
    )
    _require(
        p.mixed_precision or not p.mixed_precision_cpu,
        "parallel.mixed_precision_cpu=true needs parallel.mixed_precision=true (it applies that policy on CPU)",
    )
    _require(t.stop_at_step >= 0, "train.stop_at_step must be >= 0 (0 = no early stop)")
    _require(t.seed >= 0 and d.data_seed >= 0, "train.seed and data.data_seed must be >= 0")
    _validate_sources(cfg)
    _require(p.init_timeout_s > 0, "parallel.init_timeout_s must be positive")
    _require(t.grad_clip >= 0, "train.grad_clip must be >= 0 (0 disables clipping)")
    for name, value in (
        ("train.emulate_nondeterminism", t.emulate_nondeterminism),
        ("train.emulate_restore_error", t.emulate_restore_error),
    ):
        _require(
            0.0 <= value <= 0.1,
            f"{name} must be a relative scale in [0, 0.1] (0 = off; 6e-8 is about one fp32 ulp), got {value}",
        )
    _require(o.lr > 0 and o.eps > 0, "optim.lr and optim.eps must be positive")
    _require(0 <= o.beta1 < 1 and 0 <= o.beta2 < 1, "optim.beta1 and optim.beta2 must be in [0, 1)")
    _require(o.weight_decay >= 0, "optim.weight_decay must be >= 0")
    _require(
        s.kind in ("cosine", "constant", "wsd"), f"schedule.kind must be cosine|constant|wsd, got {s.kind!r}"
    )
    _require(s.warmup_steps >= 0, "schedule.warmup_steps must be >= 0")
    _require(0.0 <= s.min_lr_ratio <= 1.0, "schedule.min_lr_ratio must be in [0, 1]")
    _require(s.decay_steps >= 0, "schedule.decay_steps must be >= 0")
    decay = s.decay_steps_for(t.max_steps) if s.kind == "wsd" else 0
    wsd_note = f" + {decay} wsd decay steps (decay_steps=0 means 20% of max_steps)" if decay else ""
    _require(
        s.warmup_steps + decay <= t.max_steps,
        f"schedule.warmup_steps={s.warmup_steps}{wsd_note} must fit in train.max_steps={t.max_steps}; "
        "lower schedule.warmup_steps or raise train.max_steps",
    )
    r = cfg.resilience
    _require(
        r.exit_deadline_s < r.scheduler_lead_time_s,
        f"resilience.exit_deadline_s={r.exit_deadline_s} must be below resilience.scheduler_lead_time_s="
        f"{r.scheduler_lead_time_s}: the forced exit has to happen before the scheduler's kill",
    )
    for name in r.signal_names():
        _require(
            name in PREEMPTION_SIGNALS,
            f"resilience.signals: {name!r} is not one of {list(PREEMPTION_SIGNALS)}",
        )
    _require(
        r.on_resume_divergence in ("warn", "stop"),
        f"resilience.on_resume_divergence={r.on_resume_divergence!r} must be warn or stop",
    )
    _require(
        r.resume_check_floor >= 0 and math.isfinite(r.resume_check_floor),
        f"resilience.resume_check_floor={r.resume_check_floor} must be a finite number >= 0 (0 = none)",
    )
    _require(r.nan_rollback_after >= 0, "resilience.nan_rollback_after must be >= 0 (0 = never roll back)")
    _require(
        r.snapshot_every_steps >= 0 and r.snapshot_replicas >= 1,
        f"resilience.snapshot_every_steps={r.snapshot_every_steps} must be >= 0 (0 = off) and "
        f"resilience.snapshot_replicas={r.snapshot_replicas} >= 1",
    )
    _require(
        math.isfinite(r.snapshot_memory_fraction) and 0 < r.snapshot_memory_fraction <= 1,
        f"resilience.snapshot_memory_fraction={r.snapshot_memory_fraction} must be in (0, 1]",
    )
    _require(
        1 <= r.requeue_exit_code <= 254
        and not {r.requeue_exit_code, r.requeue_exit_code + 1} & RESERVED_EXIT_CODES,
        f"resilience.requeue_exit_code={r.requeue_exit_code} must be in [1, 254], and neither it nor it + 1 (the "
        f"forced exit) one of truestep's other exit codes {sorted(RESERVED_EXIT_CODES)} (docs/resilience.md)",
    )
    _require(
        math.isfinite(r.hang_step_multiple) and r.hang_step_multiple >= 0,
        f"resilience.hang_step_multiple={r.hang_step_multiple} must be a finite number >= 0 (0 = "
        "resilience.hang_timeout_s alone)",
    )
    _require(
        math.isfinite(r.exit_deadline_multiple) and r.exit_deadline_multiple >= 0,
        f"resilience.exit_deadline_multiple={r.exit_deadline_multiple} must be a finite number >= 0 (0 = "
        "resilience.exit_deadline_s alone)",
    )
    _require(
        r.exit_deadline_s > 0 and r.scheduler_lead_time_s > 0,
        "resilience.exit_deadline_s and resilience.scheduler_lead_time_s must be positive",
    )
    _require(
        min(
            r.heartbeat_interval_s,
            r.liveness_timeout_s,
            r.hang_timeout_s,
            r.collective_timeout_s,
            r.startup_timeout_s,
            r.lease_ttl_s,
            r.node_timeout_s,
        )
        > 0,
        "resilience timeouts and heartbeat_interval_s must be positive",
    )
    _require(
        r.liveness_timeout_s > 2 * r.heartbeat_interval_s,
        "resilience.liveness_timeout_s must exceed 2 x heartbeat_interval_s",
    )
    _require(
        r.node_timeout_s > 2 * r.heartbeat_interval_s,
        f"resilience.node_timeout_s={r.node_timeout_s:g} must exceed 2 x heartbeat_interval_s="
        f"{r.heartbeat_interval_s:g}: a node is judged by the beats it sends every heartbeat_interval_s",
    )
    _require(c.interval >= 0, "checkpoint.interval must be >= 0 (0 = only final/emergency saves)")
    _require(c.keep_last_n >= 0, "checkpoint.keep_last_n must be >= 0 (0 keeps all)")
    _require(c.keep_quarantined >= 0, "checkpoint.keep_quarantined must be >= 0 (0 keeps all)")
    _require(cfg.metrics.log_every >= 1, "metrics.log_every must be >= 1")
    e = cfg.eval
    _require(
        e.every_steps >= 0 and e.samples > 0 and e.batch_size > 0,
        "eval.every_steps must be >= 0 (0 = never), eval.samples and eval.batch_size positive",
    )
    _require(
        e.every_steps == 0 or e.path.strip() != "",
        f"eval.every_steps={e.every_steps} needs eval.path: a directory prepared with `truestep prepare-data` "
        "from held-out text",
    )
    _require(
        cfg.metrics.wandb in ("off", "offline", "online"),
        f"metrics.wandb must be off|offline|online, got {cfg.metrics.wandb!r}",
    )


_ROPE_SCALING_KEYS = (
    "rope_scaling_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_seq_len",
)


def _validate_rope_scaling(m: ModelConfig) -> None:
    _require(
        m.rope_scaling in ("none", "llama3", "linear"),
        f"model.rope_scaling must be none|llama3|linear, got {m.rope_scaling!r}",
    )
    if m.rope_scaling in ("none", "linear"):
        defaults = ModelConfig()
        unused = _ROPE_SCALING_KEYS if m.rope_scaling == "none" else _ROPE_SCALING_KEYS[1:]
        for key in unused:
            _require(
                getattr(m, key) == getattr(defaults, key),
                f"model.{key}={getattr(m, key)} has no effect while model.rope_scaling={m.rope_scaling!r}; "
                "set model.rope_scaling=llama3 or leave it at its default",
            )
    if m.rope_scaling == "none":
        return
    _require(
        m.rope_scaling_factor >= 1.0,
        f"model.rope_scaling_factor must be >= 1 (Llama 3.1: 8, Llama 3.2: 32), got {m.rope_scaling_factor}",
    )
    if m.rope_scaling == "linear":
        return
    _require(
        0 < m.rope_low_freq_factor < m.rope_high_freq_factor,
        f"model.rope_low_freq_factor={m.rope_low_freq_factor} must be positive and below "
        f"model.rope_high_freq_factor={m.rope_high_freq_factor} (Llama 3.1/3.2: 1 and 4)",
    )
    _require(
        m.rope_original_max_seq_len > 0,
        f"model.rope_original_max_seq_len must be positive (Llama 3: 8192), got {m.rope_original_max_seq_len}",
    )


def _validate_sources(cfg: JobConfig) -> None:
    """A mixture names each prepared directory once, with a positive finite weight, and replaces data.path."""
    sources = cfg.data.sources
    _require(
        not (sources and cfg.data.path),
        "set either data.path (one corpus) or data.sources (a mixture), not both",
    )
    for index, source in enumerate(sources):
        where = f"data.sources[{index}]"
        _require(source.path.strip() != "", f"{where}.path must name a prepared data directory")
        _require(
            math.isfinite(source.weight) and source.weight > 0,
            f"{where}.weight must be a positive finite number, got {source.weight}",
        )
    paths = [source.path for source in sources]
    repeated = sorted({path for path in paths if paths.count(path) > 1})
    _require(not repeated, f"data.sources names {', '.join(repeated)} more than once; merge their weights")


def validate_layout(cfg: JobConfig, world_size: int) -> tuple[int, int]:
    """Return (dp, tp) for this world size or raise a ConfigError saying what to change."""
    tp = cfg.parallel.tp
    _require(
        world_size % tp == 0,
        f"world size {world_size} is not divisible by parallel.tp={tp}; "
        f"launch a multiple of {tp} processes or change parallel.tp",
    )
    dp = cfg.parallel.dp_shard if cfg.parallel.dp_shard != -1 else world_size // tp
    _require(
        dp * tp == world_size,
        f"parallel.dp_shard={dp} x parallel.tp={tp} = {dp * tp} != world size {world_size}; "
        "set parallel.dp_shard=-1 to infer it",
    )
    micro = cfg.train.micro_batch(dp)
    gbs = cfg.train.global_batch_size
    _require(
        micro > 0 and gbs % (micro * dp) == 0,
        f"train.global_batch_size={gbs} must be a multiple of micro_batch_size ({micro}) x dp ({dp})",
    )
    return dp, tp
