"""Every input of a plan, typed, with a docstring per field (docs/plan.md lists them; a test checks it).

Precedence, lowest first: the defaults here (assumed), the costs measured from `--from RUN_OR_EXPERIMENT`
(plan/fit.py) and extrapolated to the target size (plan/scaling.py), a TOML file (`--config plan.toml`,
`[section]` tables), `--section.key=value` on the command line. The TOML file and the overrides go
through the trainer config's own loader (config/load.py), so a misspelled key or a wrong type is the
same one-line error (exit 2). `Provenance` records where every number came from: the output says which
numbers are measured, which extrapolated, which set and which assumed.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from truestep.config.errors import ConfigError
from truestep.config.load import apply_overrides, apply_table

RESUME_KINDS = ("graceful", "hard", "torn")
"""Resumes a disabled mechanism can corrupt: after a preemption's emergency save (graceful), from an
interval checkpoint after a crash or hang (hard), from a checkpoint torn by a failure mid-save (torn)."""
FAILURE_MODELS = ("exponential", "llama3")
MAX_REPLICAS = 100_000
"""job.replicas and `--sweep-replicas` at most (plan/budget.py sizes the rest of the work)."""
MIN_INTERVAL_S = 1.0
"""The shortest checkpoint interval of continuous training (no step time), set or found: with free
saves Daly's interval is 0, which no job can checkpoint at."""


@dataclass
class JobInputs:
    gpus: int = 2048
    """GPUs of the job (one rank per GPU)."""
    gpus_per_node: int = 8
    """GPUs per node: failures and replacements are per node."""
    job_days: float = 30.0
    """Failure-free training time of the job, in days (the work to do)."""
    work_steps: int = 0
    """If > 0, the work is this many steps of `step_time_s` instead of `job_days`."""
    step_time_s: float = 0.0
    """Compute time of one step (0: training is continuous; otherwise intervals are whole steps and a
    kill loses the step it cut short)."""
    step_overhead_s: float = 0.0
    """Wall-clock between consecutive steps that is not a step (hooks, logging): the report's `other`."""
    tokens_per_step: int = 0
    """Tokens of one global step; with `step_time_s`, goodput is also given in tokens/s."""
    checkpoint_interval_s: float = 0.0
    """Training time between checkpoints; 0 = the optimum the simulation finds."""
    checkpoint_interval_steps: int = 0
    """If > 0, the interval in steps of `step_time_s` (instead of `checkpoint_interval_s`)."""
    replicas: int = 1000
    """Monte Carlo replicas of the job for the headline numbers (sweeps use fewer)."""
    seed: int = 0
    """Seed of the simulation: the same inputs and seed give the same numbers."""


@dataclass
class FailureInputs:
    model: str = "exponential"
    """`exponential`: failures per node at `gpus_per_node / gpu_mtbf_hours`, kinds from the two fractions
    below; `llama3`: the rate and kinds of the Llama 3 report's 419 unexpected interruptions (16,384
    GPUs, 54 days; plan/failures.py), which then may not be set here."""
    gpu_mtbf_hours: float = 50677.0
    """Mean time between failures of one GPU's share of the cluster (hours; default: the Llama 3 rate)."""
    hang_fraction: float = 0.16
    """Fraction of failures that hang (alive, silent) rather than crash (default: the Llama 3 mix)."""
    node_loss_fraction: float = 0.85
    """Fraction of failures that take their node out (a replacement is needed; Llama 3 mix)."""
    preemptions_per_day: float = 0.0
    """Scheduler preemptions (or planned maintenance) of the whole job per day."""
    preemption_notice_s: float = 120.0
    """Notice before a preemption kills the job; shorter than `costs.graceful_stop_s` = a kill."""
    memory_fallback_fraction: float = 0.09
    """With peer snapshots: fraction of failures whose failed ranks' buddies are lost with them (a
    correlated failure), so the disk restores them. Default: the share of the Llama 3 interruptions whose
    cause can take several nodes at once (network switch/cable 35, power supply 3, of 419): assumed. A
    preemption that kills the job always falls back: the whole job's memory is gone."""


@dataclass
class CostInputs:
    save_blocking_s: float = 2.0
    """Training stalls this long per checkpoint with async save (measured: `checkpoint_save.blocking_s`)."""
    save_write_s: float = 30.0
    """Save start -> every shard written (`checkpoint_written.write_s`); a failure inside it tears the save."""
    save_commit_s: float = 5.0
    """Written -> committed (`checkpoint_commit.commit_s`)."""
    restore_s: float = 60.0
    """Loading the checkpoint on restart (`checkpoint_restore.restore_s`)."""
    startup_cold_s: float = 300.0
    """Process start -> first step of a fresh launch, restore excluded (the report's startup)."""
    startup_warm_s: float = 60.0
    """The same for a restart in place with a warm standby."""
    detect_crash_s: float = 10.0
    """A crash -> the supervisor sees the process exit."""
    detect_hang_s: float = 15.0
    """A hang -> the heartbeat timeout fires (heartbeats on)."""
    collective_timeout_s: float = 1800.0
    """A hang -> the collective timeout fires (heartbeats off; 1800 s is the common default)."""
    teardown_s: float = 10.0
    """Failure detected -> every rank of the attempt gone."""
    restart_delay_s: float = 5.0
    """Teardown -> the restarted ranks' processes start (restart in place)."""
    requeue_delay_s: float = 300.0
    """The job stopped -> relaunched by the scheduler (after a preemption, or onto a spare node)."""
    node_replace_s: float = 14400.0
    """Extra wait for a replacement node when no spare is at hand."""
    graceful_stop_s: float = 60.0
    """Preemption signal -> every rank exited with its emergency checkpoint committed."""
    other_per_attempt_s: float = 0.0
    """Per attempt: time no bucket covers (shutdown, bookkeeping; the report's `other`)."""
    snapshot_capture_s: float = 0.5
    """With peer snapshots: one snapshot's capture, this rank's state copied to host memory and hashed
    (`snapshot_agreed.capture_s`). It overlaps the next step's forward and backward; the update waits for
    what is left of it: max(0, capture - job.step_time_s) per snapshot."""
    snapshot_agree_s: float = 0.01
    """With peer snapshots: the agreement at the next step boundary that every rank holds the snapshot
    (`snapshot_agreed.blocked_s`; the replica's transfer is assumed done within a step)."""
    memory_restore_s: float = 5.0
    """Restoring from peers' memory on restart (`memory_restore.restore_s`: a buddy's copy received and
    checked, the others' own read back)."""


@dataclass
class MechanismInputs:
    async_save: bool = True
    """Off: training blocks for the whole save (write and commit)."""
    warm_standby: bool = True
    """Off: a restart in place starts cold."""
    heartbeat: bool = True
    """Off: hangs are detected by the collective timeout."""
    spare_nodes: int = 2
    """Nodes held in reserve (they count against the allocation); 0: a lost node means waiting for one."""
    restore_optimizer_state: bool = True
    """Off: a resume restarts the optimizer moments (corrupts the resumes `optimizer_corrupts` names)."""
    restore_rng_state: bool = True
    """Off: a resume re-seeds the RNG streams."""
    restore_data_position: bool = True
    """Off: a resume restarts the data order."""
    atomic_commit: bool = True
    """Off: the newest checkpoint directory is trusted, committed or not."""
    optimizer_corrupts: str = "graceful,hard"
    """Resumes that optimizer-restore-off corrupts (from the ablation when measured): graceful, hard, torn."""
    rng_corrupts: str = "graceful,hard"
    """Resumes that RNG-restore-off corrupts (empty when the RNG does not shape the trajectory)."""
    data_position_corrupts: str = "graceful,hard"
    """Resumes that data-position-off corrupts."""
    atomic_commit_corrupts: str = "torn"
    """Resumes that atomic-commit-off corrupts."""
    snapshot_every_steps: int = 0
    """Peer snapshots every k steps (the trainer's resilience.snapshot_every_steps; 0 = off, its default):
    a failure restores the last agreed snapshot from memory, losing at most k steps, unless it falls back
    to disk (failures.memory_fallback_fraction, a preemption that kills the job). Needs job.step_time_s."""


@dataclass
class ScalingInputs:
    model: str = ""
    """Target model: a preset name or a trainer config file (its [model] table); '' = as measured."""
    params: float = 0.0
    """Target parameter count, instead of `model` (0: from `model`, or as measured)."""
    bytes_per_param: float = 12.0
    """Checkpoint bytes per parameter (fp32 weights + two AdamW moments; measured from a checkpoint)."""
    staging_gbps_per_rank: float = 10.0
    """Async save: device -> host copy per rank (GB/s), the blocking part."""
    write_gbps_per_rank: float = 2.0
    """Storage write bandwidth one rank gets (GB/s)."""
    write_gbps_total: float = 2000.0
    """Aggregate storage write bandwidth (GB/s; the Llama 3 report's Tectonic sustained ~2 TB/s)."""
    read_gbps_per_rank: float = 4.0
    """Storage read bandwidth one rank gets (GB/s)."""
    read_gbps_total: float = 2000.0
    """Aggregate storage read bandwidth (GB/s)."""
    hash_gbps_per_rank: float = 1.0
    """Checksumming speed per rank at commit (GB/s; each rank verifies its own shards)."""
    network_gbps_per_rank: float = 25.0
    """Network bandwidth one rank gets to a peer on another node (GB/s; 25 = 200 Gb/s per GPU): a
    snapshot replica's transfer to its buddy, and back in a memory restore."""


@dataclass
class PlanInputs:
    job: JobInputs = field(default_factory=JobInputs)
    """The job and the simulation."""
    failures: FailureInputs = field(default_factory=FailureInputs)
    """What interrupts the job."""
    costs: CostInputs = field(default_factory=CostInputs)
    """Phase costs at the target size (measured, extrapolated, set or assumed)."""
    mechanisms: MechanismInputs = field(default_factory=MechanismInputs)
    """The recovery mechanisms' switches (docs/checkpointing.md, docs/resilience.md)."""
    scaling: ScalingInputs = field(default_factory=ScalingInputs)
    """Model shape -> bytes per rank -> save and restore time (plan/scaling.py)."""


@dataclass
class Provenance:
    """`section.key` -> where its value came from; absent = the default (assumed)."""

    source: dict[str, str] = field(default_factory=dict)

    def label(self, key: str) -> str:
        return self.source.get(key, "assumed (default)")

    def kind(self, key: str) -> str:
        """measured, extrapolated, set or assumed."""
        return self.label(key).split(" ", 1)[0]


def keys(inputs: PlanInputs) -> list[str]:
    return [
        f"{s.name}.{f.name}"
        for s in dataclasses.fields(inputs)
        for f in dataclasses.fields(getattr(inputs, s.name))
    ]


def get(inputs: PlanInputs, key: str) -> Any:
    section, name = key.split(".", 1)
    return getattr(getattr(inputs, section), name)


def put(inputs: PlanInputs, key: str, value: Any) -> None:
    section, name = key.split(".", 1)
    setattr(getattr(inputs, section), name, value)


def apply_user(inputs: PlanInputs, prov: Provenance, config: Path | None, overrides: list[str]) -> None:
    """The TOML file, then the command-line overrides, over whatever is in `inputs` already."""
    if config is not None:
        try:
            table = tomllib.loads(config.read_text(encoding="utf-8"))
        except OSError as err:
            raise ConfigError(f"cannot read {config}: {err.strerror or err}") from err
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{config}: invalid TOML: {err}") from err
        apply_table(inputs, table, str(config))  # type: ignore[arg-type]  # any dataclass of sections
        for section, values in table.items():
            for name in values:
                prov.source[f"{section}.{name}"] = f"set in {config.name}"
    apply_overrides(inputs, overrides)  # type: ignore[arg-type]
    for raw in overrides:
        prov.source[raw.removeprefix("--").split("=", 1)[0]] = "set on the command line"
    validate(inputs, prov)


def corrupts(text: str, key: str) -> frozenset[str]:
    kinds = frozenset(k.strip() for k in text.split(",") if k.strip())
    if not kinds <= set(RESUME_KINDS):
        raise ConfigError(
            f"{key}: {text!r} names unknown resumes; use a comma list of {', '.join(RESUME_KINDS)}"
        )
    return kinds


def validate(inputs: PlanInputs, prov: Provenance) -> None:
    """Refuse what the simulation cannot mean (ConfigError: one line, exit 2)."""
    job, fail = inputs.job, inputs.failures
    numbers = {k: get(inputs, k) for k in keys(inputs)}
    numbers = {k: v for k, v in numbers.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    infinite = [k for k, v in numbers.items() if not math.isfinite(v)]
    if infinite:
        raise ConfigError(f"must be finite numbers: {', '.join(infinite)}")
    if job.gpus < 1 or job.gpus_per_node < 1:
        raise ConfigError("job.gpus and job.gpus_per_node must be >= 1")
    if not 2 <= job.replicas <= MAX_REPLICAS:
        raise ConfigError(
            f"job.replicas must be within [2, {MAX_REPLICAS}] (intervals need more than one replica; more "
            "than the bound adds nothing but time)"
        )
    for name in ("work_steps", "checkpoint_interval_steps"):
        if getattr(job, name) > 0 and job.step_time_s <= 0:
            raise ConfigError(f"job.{name} needs job.step_time_s > 0")
    if 0 < job.checkpoint_interval_s < MIN_INTERVAL_S and job.step_time_s <= 0:
        raise ConfigError(
            f"job.checkpoint_interval_s must be 0 (the plan finds it) or >= {MIN_INTERVAL_S:g} s, got "
            f"{job.checkpoint_interval_s:g}"
        )
    if job.work_steps == 0 and job.job_days <= 0:
        raise ConfigError("job.job_days must be > 0")
    if fail.model not in FAILURE_MODELS:
        raise ConfigError(f"failures.model must be one of {', '.join(FAILURE_MODELS)}, got {fail.model!r}")
    if fail.model == "llama3":
        clash = [
            k
            for k in ("gpu_mtbf_hours", "hang_fraction", "node_loss_fraction")
            if f"failures.{k}" in prov.source
        ]
        if clash:
            raise ConfigError(
                f"failures.model = llama3 sets the rate and kinds itself; do not also set {', '.join(clash)}"
            )
    for name in ("hang_fraction", "node_loss_fraction"):
        if not 0.0 <= getattr(fail, name) <= 1.0:
            raise ConfigError(f"failures.{name} must be within [0, 1]")
    if fail.gpu_mtbf_hours <= 0:
        raise ConfigError("failures.gpu_mtbf_hours must be > 0")
    negative = [
        k
        for k in keys(inputs)
        if isinstance(get(inputs, k), int | float)
        and not isinstance(get(inputs, k), bool)
        and get(inputs, k) < 0
    ]
    if negative:
        raise ConfigError(f"must not be negative: {', '.join(negative)}")
    m = inputs.mechanisms
    for key in ("optimizer_corrupts", "rng_corrupts", "data_position_corrupts", "atomic_commit_corrupts"):
        corrupts(getattr(m, key), f"mechanisms.{key}")
    validate_snapshots(inputs)


SNAPSHOT_INPUTS = (
    "mechanisms.snapshot_every_steps",
    "failures.memory_fallback_fraction",
    "costs.snapshot_capture_s",
    "costs.snapshot_agree_s",
    "costs.memory_restore_s",
    "scaling.network_gbps_per_rank",
)
"""The peer-snapshot inputs (plan/snapshots.py)."""


def validate_snapshots(inputs: PlanInputs) -> None:
    """The peer-snapshot inputs: finite, not negative (as every input), a fraction within [0, 1], a
    bandwidth above 0, and snapshots every k steps only with a step time to make k steps of."""
    bad = [k for k in SNAPSHOT_INPUTS if not math.isfinite(get(inputs, k)) or get(inputs, k) < 0]
    if bad:
        raise ConfigError(f"must be finite and not negative: {', '.join(bad)}")
    if inputs.failures.memory_fallback_fraction > 1.0:
        raise ConfigError("failures.memory_fallback_fraction must be within [0, 1]")
    if inputs.scaling.network_gbps_per_rank <= 0:
        raise ConfigError("scaling.network_gbps_per_rank must be > 0")
    if inputs.mechanisms.snapshot_every_steps > 0 and inputs.job.step_time_s <= 0:
        raise ConfigError(
            "mechanisms.snapshot_every_steps needs job.step_time_s > 0 (snapshots are every k steps)"
        )
