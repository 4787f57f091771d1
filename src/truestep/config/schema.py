"""Typed job configuration.

Every field carries a docstring (the string literal right after it); `truestep config --reference`
and docs/config.md are generated from these, and a test checks that none is missing. Rules derived
from several fields (the effective micro-batch, the wsd decay length, the signal list) are methods
here, so they are decided in one place.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    dim: int = 256
    """Model (residual stream) width."""
    n_layers: int = 4
    """Number of transformer blocks."""
    n_heads: int = 8
    """Number of query heads; must divide `dim` and be divisible by `parallel.tp`."""
    n_kv_heads: int = 0
    """Number of key/value heads for grouped-query attention; 0 means equal to `n_heads`."""
    head_dim: int = 0
    """Width of each attention head; 0 means `dim / n_heads`. Set it to decouple the head width from
    `dim` (then `dim` need not be divisible by `n_heads`). Must be even (RoPE rotates pairs)."""
    vocab_size: int = 512
    """Embedding rows; must be at least the tokenizer's vocabulary size."""
    multiple_of: int = 256
    """Llama rule: the SwiGLU hidden size is rounded up to a multiple of this."""
    ffn_dim_multiplier: float = 0.0
    """Llama rule: scale applied to the 8/3*dim hidden size before rounding; 0 means none."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 500000.0
    """RoPE base frequency (positive)."""
    rope_scaling: str = "none"
    """RoPE frequency scaling: none; llama3 (Llama 3.1/3.2 long context: low frequencies divided by
    `rope_scaling_factor`, high ones kept, a smooth blend between; set by the `rope_*` keys below); or
    linear (every frequency divided by `rope_scaling_factor`, i.e. positions interpolated: Hugging Face
    `rope_type: linear`)."""
    rope_scaling_factor: float = 8.0
    """llama3 scaling: divisor of the low frequencies (Llama 3.1: 8, Llama 3.2: 32); linear scaling: divisor
    of every frequency."""
    rope_low_freq_factor: float = 1.0
    """llama3 scaling: wavelengths above rope_original_max_seq_len / this are divided by the factor."""
    rope_high_freq_factor: float = 4.0
    """llama3 scaling: wavelengths below rope_original_max_seq_len / this are kept unchanged."""
    rope_original_max_seq_len: int = 8192
    """llama3 scaling: the context length the model was pre-trained at before scaling (HF
    `original_max_position_embeddings`)."""
    max_seq_len: int = 2048
    """Longest sequence the RoPE tables are built for; `data.seq_len` must not exceed it. At most 1048576
    (the tables cover every position)."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection (Llama 3 unties them)."""
    dropout: float = 0.0
    """Residual dropout after attention and MLP (Llama uses 0). Non-zero makes the RNG streams shape
    the trajectory, which is what the RNG-restore ablation needs."""
    init_std: float = 0.02
    """Standard deviation of the normal init; output projections use init_std/sqrt(2*n_layers)."""


@dataclass
class ParallelConfig:
    tp: int = 1
    """Tensor-parallel degree (innermost mesh dim). Must divide the world size, n_heads and n_kv_heads."""
    dp_shard: int = -1
    """FSDP2 data-parallel degree; -1 means world_size / tp."""
    backend: str = "auto"
    """Process-group backend: auto (gloo on CPU, nccl on CUDA), gloo or nccl."""
    device: str = "auto"
    """Compute device: auto (cuda if available), cpu or cuda."""
    mixed_precision: bool = True
    """bf16 parameters with fp32 gradient reduction on CUDA, applied through FSDP2 (so only when dp > 1).
    On CPU only with mixed_precision_cpu."""
    mixed_precision_cpu: bool = False
    """Apply mixed_precision on CPU too (FSDP2's MixedPrecisionPolicy, as on CUDA: bf16 compute copies of
    the parameters and bf16 activations, fp32 gradient reduction, fp32 master weights and optimizer state),
    which roughly halves the activation memory. Needs FSDP (dp > 1): a single process is refused rather
    than silently run in fp32. Off by default: fp32 CPU runs are the bitwise reference of every test.
    Deterministic, so resumes stay bitwise; a different trajectory than fp32, so do not switch it in the
    middle of a run."""
    cpu_return_freed_memory: bool = True
    """On CPU (Linux, glibc): give every allocation of 128 KiB or more its own mapping, so memory freed
    after the backward goes back to the OS instead of staying in the heap as fragments (without it a
    rank's resident set grew step after step, to 20 % above its live tensors: benchmarks/README.md,
    "Memory"). The measured peak then matches the memory estimate. Costs the page faults of fresh
    memory each step. Not part of the numerics."""
    num_threads: int = 1
    """CPU threads per process. Part of the numerics on CPU: keep it the same across resumes."""
    init_timeout_s: float = 600.0
    """Collective timeout during start-up, restore and the first step (seconds)."""
    meta_init: bool = True
    """Build the model on the meta device and allocate only this rank's shards: while initializing, a
    rank holds its shards plus one full parameter, never the whole model. The weights are bitwise those
    of an unsharded init either way; false builds the full model on every rank first (for comparison)."""


@dataclass
class SourceConfig:
    path: str = ""
    """Directory written by `truestep prepare-data` holding this source's tokens."""
    weight: float = 1.0
    """This source's share of the samples, relative to the other sources' weights (positive)."""


@dataclass
class DataConfig:
    path: str = ""
    """Directory written by `truestep prepare-data`; empty means the built-in demo corpus (or `sources`)."""
    sources: list[SourceConfig] = field(default_factory=list)
    """A mixture instead of `path`: `[{path = "data/web", weight = 0.7}, {path = "data/code", weight =
    0.3}]` (on the command line: `--data.sources='[{path="data/web", weight=0.7}, ...]'`). Every source is
    a prepared directory of the same tokenizer; samples are interleaved deterministically in proportion to
    the weights (docs/data.md). Part of the trajectory: a resume with other sources or weights is refused
    unless checkpoint.allow_config_change."""
    seq_len: int = 256
    """Tokens per training sample."""
    data_seed: int = 1234
    """Seed of the global sample order; the order is a pure function of (data_seed, step)."""


@dataclass
class TrainConfig:
    seed: int = 0
    """Seed for parameter init and the per-rank RNG streams."""
    init_scheme: str = "blockwise"
    """How a fresh start draws the initial weights from `train.seed` (a resume draws none: it loads them; part of the trajectory).
    "blockwise": each fixed tile of a parameter (16 rows x 1024 columns) from its own generator seeded
    from (seed, parameter name, tile position), so each rank computes only its own shard, O(shard), and
    every layout still gets the same weights bit for bit. "full": one generator draws every parameter's
    full value in order and each rank keeps its part, O(model) per rank: the only scheme before round 3,
    for reproducing runs started with it (the two give different initial weights)."""
    max_steps: int = 100
    """Optimizer steps to train for."""
    global_batch_size: int = 8
    """Samples per optimizer step across all data-parallel ranks."""
    micro_batch_size: int = 0
    """Samples per forward/backward on one data-parallel rank; 0 means global_batch_size / dp
    (no accumulation). global_batch_size must be a multiple of micro_batch_size * dp."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    stop_at_step: int = 0
    """Stop cleanly (with a checkpoint) once this step is done, as a planned interruption; 0 = run to
    max_steps. Not part of the trajectory: the resumed run continues to max_steps."""
    deterministic: bool = True
    """Call torch.use_deterministic_algorithms(True) (needed for bitwise-reproducible CUDA runs)."""
    emulate_nondeterminism: float = 0.0
    """Emulation of GPU reduction-order noise on a deterministic platform, for measuring the instrument
    (docs/measures.md): every gradient element g becomes g * (1 + s * e), e ~ N(0, 1) drawn from OS
    entropy (not the seed), so same-seed runs drift apart as GPU runs do. s is the relative scale: 6e-8
    is about one fp32 ulp. 0 = off. Part of the trajectory fingerprint."""
    emulate_restore_error: float = 0.0
    """Emulation of a wrong restore, for measuring the instrument's detection power: after every
    checkpoint restore, every parameter element p becomes p * (1 + d * e), e ~ N(0, 1) from OS entropy.
    d is the relative error. 0 = off (never set it in a real run)."""
    activation_checkpointing: str = "none"
    """Recompute activations in the backward instead of keeping them (model/recompute.py): none; full
    (every transformer block keeps only its input and recomputes the rest: least memory, about one
    extra forward per step); selective (every other block, 0, 2, 4, ...: about half of each). The
    embedding, final norm and output projection are never recomputed. Bitwise the same trajectory as
    none on a deterministic platform, so it may change between resumes."""
    memory_check: bool = True
    """Before building the model, estimate this rank's peak memory (parallel/memory.py: parameters,
    gradients, optimizer state, activations at this layout), log it (event memory_estimate, one console
    line) and refuse the job (exit 2) when the ranks on this host would need more than the host's
    available memory (MemAvailable) or, on CUDA, more than the GPU's free memory. Off = estimate and log
    only (for an estimate you know to be pessimistic)."""

    def micro_batch(self, dp: int) -> int:
        """Samples per forward/backward on one data-parallel rank: micro_batch_size, or with 0 the
        whole per-rank share global_batch_size / dp (no accumulation)."""
        return self.micro_batch_size or self.global_batch_size // dp


@dataclass
class OptimConfig:
    lr: float = 3e-4
    """Peak learning rate."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay."""
    foreach: bool = True
    """AdamW's multi-tensor (foreach) update: fastest, but it allocates one temporary as large as this
    rank's parameters at every update, often the peak of a large model's step. false updates parameter
    by parameter (the temporary is one parameter's size: about 4 bytes per parameter less at the peak)
    at some speed cost. Part of the trajectory (a different summation order may round differently)."""


@dataclass
class ScheduleConfig:
    kind: str = "cosine"
    """Learning-rate schedule after warmup: cosine, constant or wsd (warmup-stable-decay)."""
    warmup_steps: int = 10
    """Linear warmup steps from lr/warmup_steps to lr. Unless set on the command line, a warm-up that does
    not fit train.max_steps is shrunk to half the steps left, with a note (config/fit.py)."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak (cosine and wsd)."""
    decay_steps: int = 0
    """wsd only: length of the final linear decay; 0 means 20% of max_steps."""

    def decay_steps_for(self, max_steps: int) -> int:
        """The wsd decay length in effect: decay_steps, or 20% of max_steps (at least 1)."""
        return self.decay_steps or max(1, max_steps // 5)


@dataclass
class CheckpointConfig:
    dir: str = ""
    """Checkpoint directory; empty means <run.dir>/checkpoints."""
    interval: int = 0
    """Save every this many steps; 0 saves only at the end and on emergencies."""
    async_save: bool = True
    """Overlap writing with training (dcp.async_save on its own gloo group); false blocks until written."""
    keep_last_n: int = 3
    """Committed checkpoints to keep; never removes the newest verified one or one being written. 0 keeps all."""
    keep_quarantined: int = 0
    """Quarantined checkpoints (torn or failed, in quarantine/) to keep for post-mortems: after each commit
    the oldest beyond this many are deleted. 0 keeps all (quarantine/ then grows by one checkpoint per
    fault that tears a save or corrupts one)."""
    verify_checksums: bool = True
    """Verify SHA-256 on resume: the small files before the load, each shard item by the rank that loads it
    as it loads it (no extra read pass). Sizes and structure are always checked."""
    resume: bool = True
    """Resume from the newest verified checkpoint when one exists."""
    overwrite: bool = False
    """With resume=false: set aside (never delete) the committed checkpoints of an earlier trajectory in
    this checkpoint directory, moving them to superseded/; without it, such a start is refused."""
    allow_fresh_start: bool = False
    """Start from step 0 even though checkpoints exist but none verifies (otherwise: error)."""
    allow_config_change: bool = False
    """Resume although trajectory-relevant config keys differ from the checkpoint's."""
    init_from: str = ""
    """Initial weights (a truestep checkpoint directory) for a fresh run; ignored when resuming."""
    verify_restored_digest: bool = True
    """Mechanism switch: after a restore into the layout that saved the checkpoint, the parameter digest of
    the restored model must equal the one the save recorded in the checkpoint (its save.json); a mismatch
    is a failed restore (quarantined, the next older checkpoint is tried). Costs one SHA-256 pass over
    the local parameter shards per restore."""
    emulate_unstaged_async_save: bool = False
    """Test switch (never in a real run): async saves take no staged copy, so the background writer reads
    the live tensors (checkpoint/unstaged.py). With a `mutate` fault it makes a checkpoint that is not what
    was saved, for showing that verify_restored_digest catches it."""
    restore_optimizer_state: bool = True
    """Ablation switch: restore AdamW moments. Off = fresh optimizer state on resume."""
    restore_rng_state: bool = True
    """Ablation switch: restore every rank's RNG streams. Off = re-seed as at a fresh start."""
    restore_data_position: bool = True
    """Ablation switch: restore the sampler position. Off = the data order restarts at batch 0."""
    atomic_commit: bool = True
    """Ablation switch: the manifest + commit-marker protocol. Off = "directory exists means complete"."""


@dataclass
class ResilienceConfig:
    signals: str = "SIGTERM,SIGUSR1"
    """Comma-separated signals that mean "preemption coming": ranks agree, save, exit with requeue_exit_code."""
    signal_agreement: bool = True
    """Mechanism switch: agree on the stop step across ranks (a one-integer all-reduce per step). Off =
    each rank acts on its own signal alone, which can leave peers waiting in a collective."""
    requeue_exit_code: int = 75
    """Exit code after a graceful preemption (EX_TEMPFAIL): the supervisor and the sbatch script requeue.
    In [1, 254]; neither it nor it + 1 (the forced exit) may be another truestep exit code."""
    exit_deadline_s: float = 90.0
    """After a preemption signal, exit hard (code requeue_exit_code + 1) if the graceful path has not
    finished within this many seconds, or within the allowance exit_deadline_multiple gives, if longer.
    Must be below scheduler_lead_time_s."""
    exit_deadline_multiple: float = 2.0
    """The graceful-stop deadline grows with the job: a signal gets max(exit_deadline_s, this x (the
    longest step + the longest checkpoint save, written and committed, this rank has measured)), since
    the graceful path finishes the step under way and then saves. With 110 s steps a fixed 90 s ended
    in a forced exit and a torn checkpoint. When the allowance passes scheduler_lead_time_s the run says
    so once (event exit_deadline_beyond_lead_time): ask the scheduler for an earlier warning. 0 =
    exit_deadline_s alone."""
    scheduler_lead_time_s: float = 120.0
    """How long before the kill the scheduler's warning arrives (SLURM --signal=...@N); validated against
    exit_deadline_s."""
    nan_guard: bool = True
    """Mechanism switch: skip the optimizer update when the loss or global grad norm is not finite."""
    nan_rollback_after: int = 3
    """Roll back to the newest verified checkpoint after this many consecutive skipped steps; 0 never."""
    heartbeat: bool = True
    """Mechanism switch: every rank writes a liveness + progress heartbeat that the supervisor watches."""
    startup_timeout_s: float = 20.0
    """Supervisor: a rank that has written no heartbeat this long after it was spawned is stopped or
    stuck while starting. The heartbeat starts before torch is imported (measured: 0.25-0.5 s after the
    spawn on a loaded 2-core machine). Also how long a rank still importing torch (phase `loading`) may
    go without a beat, if longer than liveness_timeout_s: loading holds the GIL, which stalls the beat."""
    lease_ttl_s: float = 30.0
    """The run directory lease is renewed every lease_ttl_s / 4; a lease held from another host that was
    not renewed for this long is stale and may be taken over by another job."""
    heartbeat_interval_s: float = 0.5
    """Seconds between heartbeats (written by a thread that does not wait for the training loop)."""
    liveness_timeout_s: float = 5.0
    """Supervisor: a rank whose heartbeat is this stale is hung or stopped (e.g. SIGSTOP)."""
    process_watch: bool = True
    """Mechanism switch: the supervisor also watches each rank from outside its interpreter, in
    /proc/PID/stat: a stopped process (SIGSTOP) is declared after liveness_timeout_s in every phase (also
    while importing torch, when its heartbeat cannot beat), one asleep with no CPU progress before its
    first beat or while loading likewise, and time a rank waited for a CPU does not count against its
    start-up. Linux only: without /proc the heartbeat rules stand alone. Off = heartbeats alone."""
    hang_timeout_s: float = 10.0
    """Supervisor: a rank whose step has not advanced for this long while training (not while starting,
    checkpointing or restoring) is declared hung, unless hang_step_multiple allows longer. Until the
    first step has completed (it is start-up, not judged by this rule) it is the whole rule."""
    hang_step_multiple: float = 5.0
    """Supervisor: the hang rule grows with the job's own steps: a step is hung once it has taken longer
    than max(hang_timeout_s, hang_step_multiple x the longest step any rank of this launch has reported
    in its heartbeat, batch fetch included, the first step's warm-up too), so a model whose steps take
    longer than expected (a bigger state, a slower node) is not declared hung for it. A hung step cannot
    lengthen its own allowance (only completed steps are reported). 0 = hang_timeout_s alone."""
    collective_timeout_s: float = 60.0
    """Collective timeout once the first step is done (parallel.init_timeout_s applies before)."""
    warm_standby: bool = True
    """Mechanism switch (speed, not correctness): `truestep launch` starts one template process per node
    that imports torch and truestep once and forks every rank of every attempt from it, instead of a cold
    process per rank (docs/resilience.md, "Warm standby"). Costs one idle process per node (memory
    only); never touches the GPU. Off = every rank starts cold."""
    node_watch: bool = True
    """Mechanism switch: the supervisors of a multi-node job watch each other over the job's network and
    stop for a requeue when a node is gone. Off = a lost node is seen only as local rank failures: the
    survivors restart in place and wait for the scheduler to notice (SlurmdTimeout)."""
    node_timeout_s: float = 5.0
    """Multi-node jobs: the supervisors of all nodes exchange a beat every heartbeat_interval_s over the
    job's network; a node silent this long (a partition, a powered-off node) is lost, and the others stop
    for a requeue (exit 77) instead of restarting in place. A node whose processes die is noticed at once
    (its connection closes). Keep it below hang_timeout_s and above the longest network blip you accept."""

    resume_check: bool = True
    """Mechanism switch: after a restore, compare every recomputed step up to the last one logged before
    the fault with its pre-fault metrics line (loss and grad norm bit patterns, lr, tokens seen) and log
    resume_verified / resume_unverified / resume_diverged (docs/resilience.md, "Resume self-check").
    Costs one read of metrics.jsonl per resume: the steps are recomputed anyway."""
    on_resume_divergence: str = "warn"
    """What a diverged resume self-check does: warn (an event, a console line, train on) or stop (exit 3
    before training on the diverged trajectory, before the next checkpoint is saved)."""
    resume_check_floor: float = 0.0
    """Where the platform is not bitwise-deterministic (train.deterministic=false, a GPU, emulated noise,
    a changed layout): the largest |loss difference| of a replayed step that still counts as the same
    trajectory (e.g. the floor measured by `truestep experiment`). 0 = none: the deviation is reported
    without a verdict (resume_unverified)."""
    snapshot_every_steps: int = 0
    """Mechanism switch, 0 = off (the default): every this many steps each rank copies its whole
    trajectory state (parameter and optimizer shards, RNG streams, data position, counters) into host
    memory in the background, and a copy reaches snapshot_replicas buddy ranks; a failed rank is then
    restored from its buddy's memory and the survivors from their own, losing at most this many steps
    (checkpoint/memory/, docs/resilience.md). Off by default because it costs host memory:
    2 x (1 + snapshot_replicas) x the rank's state (double-buffered), checked at start."""
    snapshot_replicas: int = 1
    """How many buddy ranks hold a copy of each rank's snapshot (on another node when there are several);
    capped at world_size - 1. A rank and all its buddies lost together recover from disk."""
    snapshot_dir: str = ""
    """Where snapshots live in host memory: a tmpfs directory ("" = /dev/shm/truestep-snapshots). Each
    host's part is its own (the host name is in the path)."""
    snapshot_memory_fraction: float = 0.5
    """Refuse at start (exit 2) when the snapshots would need more than this fraction of the host memory
    available to them (the free space of snapshot_dir's filesystem and MemAvailable, the smaller)."""

    def signal_names(self) -> list[str]:
        """`signals` split into names (checked against PREEMPTION_SIGNALS by config.validate)."""
        return [name.strip() for name in self.signals.split(",") if name.strip()]

    def preemption_signals(self) -> list[signal.Signals]:
        """The signals that mean "preemption coming"."""
        return [signal.Signals[name] for name in self.signal_names()]

    def exit_allowance(self, longest_step_s: float, longest_save_s: float) -> tuple[float, str]:
        """How long the graceful path after a preemption signal may take before the forced exit, given
        the longest step and save measured, and which rule set it."""
        scaled = self.exit_deadline_multiple * (longest_step_s + longest_save_s)
        if scaled > self.exit_deadline_s:
            return scaled, (
                f"resilience.exit_deadline_multiple={self.exit_deadline_multiple:g} x (the longest step, "
                f"{longest_step_s:.1f}s, + the longest save, {longest_save_s:.1f}s)"
            )
        return self.exit_deadline_s, f"resilience.exit_deadline_s={self.exit_deadline_s:g}"

    def hang_allowance(self, longest_step_s: float) -> tuple[float, str]:
        """How long a training step may take before it is declared hung, given the longest step seen,
        and which rule set it (for the failure's detail): the supervisor's and the planner's one rule."""
        scaled = self.hang_step_multiple * longest_step_s
        if scaled > self.hang_timeout_s:
            return (
                scaled,
                f"resilience.hang_step_multiple={self.hang_step_multiple:g} x the longest step, {longest_step_s:.1f}s",
            )
        return self.hang_timeout_s, f"resilience.hang_timeout_s={self.hang_timeout_s:g}"


@dataclass
class MetricsConfig:
    log_every: int = 1
    """Console progress interval in steps: the bar's postfix, or one plain line (metrics.jsonl always gets
    every step)."""
    progress: bool = True
    """Show a progress bar on the console (rank 0), only when stderr is a terminal: in a log file a bar
    is a line of carriage returns. Elsewhere (or off) the console gets plain step lines (step_lines)."""
    step_lines: bool = True
    """When no progress bar is drawn: one plain line on stderr every log_every steps (and at the last):
    step, loss, lr, grad norm, tokens/s, peak memory, and MFU where the device's peak is known."""
    banner: bool = True
    """Say what trains at the start, on stderr (model, layout, data, where the weights came from, the
    memory estimate); the run_start event has it all anyway."""
    narrate: bool = True
    """Say each recovery event on stderr as one line (preempted, saved, resuming from, quarantined,
    failure detected, restarting, the exit code and what to run next); the event log has them anyway."""
    tensorboard: bool = False
    """Also write the step scalars as TensorBoard event files under <run.dir>/tb."""
    wandb: str = "off"
    """Also log the step scalars and evaluations to Weights & Biases: off, offline (files under
    <run.dir>/wandb, no network or account needed; `wandb sync` them later) or online. Needs the optional
    package (pip install 'truestep[wandb]'); without it the run is refused (exit 2). Each attempt is one
    W&B run, grouped by the run directory."""
    wandb_project: str = "truestep"
    """The W&B project the runs are logged to."""


@dataclass
class EvalConfig:
    every_steps: int = 0
    """Evaluate the held-out loss and perplexity every this many steps (events.jsonl `eval`, one console
    line, TensorBoard eval/*, W&B); 0 = never. Evaluation draws no random numbers and leaves the model in
    training mode, so the trajectory is the same with or without it."""
    path: str = ""
    """The held-out data: a directory prepared by `truestep prepare-data` from text the run does not
    train on (a second source, e.g. a split kept aside before preparing), with the training data's
    tokenizer. Required when every_steps > 0."""
    samples: int = 64
    """Windows of data.seq_len tokens evaluated each time: always the first `samples` windows of `path`,
    in order, split evenly across the data-parallel ranks (so it must be a multiple of dp). The same
    text every time, so a resumed run's evaluation at a step is bitwise the one an uninterrupted run
    made there (on a deterministic platform, same layout)."""
    batch_size: int = 8
    """Windows per forward pass on one rank while evaluating."""


@dataclass
class RunConfig:
    dir: str = "runs/default"
    """Run directory: metrics.jsonl, events.jsonl, checkpoints. Must not be empty; truestep's own entries
    in it must not be symlinks (docs/checkpointing.md, threat model)."""
    name: str = ""
    """Free-form run name recorded in the events log."""
    allow_env_faults: bool = False
    """Arm the fault specs of the TRUESTEP_FAULTS environment variable (same as `--allow-env-faults` on
    `truestep train`/`launch`). Off: a launch that inherits TRUESTEP_FAULTS is refused (exit 2), so a
    variable left in a shell never damages an ordinary run (docs/faults.md)."""


@dataclass
class JobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model shape."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Mesh, backend, device."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training data."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Steps, batch, seed."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW hyperparameters."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Learning-rate schedule."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing and resume (with the ablation switches)."""
    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)
    """Preemption signals, NaN guard, heartbeats and timeouts (with their switches)."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Logging."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run directory and name."""


PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP")
"""Signals `resilience.signals` may name."""

# Keys whose change alters the trajectory; resume refuses a mismatch unless allowed.
# Layout (parallel.*) is deliberately absent: resharded resume is supported.
ACTIVATION_CHECKPOINTING = ("none", "full", "selective")
"""The values of train.activation_checkpointing (model/recompute.py)."""

TRAJECTORY_SECTIONS = ("model", "data", "optim", "schedule")
TRAJECTORY_KEYS = (
    "train.seed",
    "train.init_scheme",
    "train.max_steps",
    "train.global_batch_size",
    "train.grad_clip",
    "train.micro_batch_size",
    "train.emulate_nondeterminism",
)
