"""Every name a run directory holds and every TRUESTEP_* environment variable, defined once.

The run directory is the only interface between a run and whatever studies it (analysis, `ckpt`,
the supervisor, SLURM scripts), so its names live here and nowhere else; a test checks that no other
module spells them.
"""

from __future__ import annotations

from pathlib import Path

# ---------------------------------------------------------------- run directory
METRICS_FILE = "metrics.jsonl"
"""One line per training step (rank 0)."""
EVENTS_FILE = "events.jsonl"
"""Everything a mechanism did and when: run start/end, checkpoints, signals, faults, failures."""
CONFIG_FILE = "config.toml"
"""The resolved config of the latest attempt."""
HEARTBEAT_DIR = "heartbeats"
"""Per-rank liveness and progress files watched by the supervisor."""
HEARTBEAT_FILE = "rank{rank:05d}.json"
CHECKPOINTS_DIR = "checkpoints"
"""Default checkpoint root inside the run directory."""
LEASE_FILE = "lease.json"
"""Who owns the run directory now (job, host, pid, incarnation); see resilience/lease.py."""
LEASE_LOCK_FILE = ".lease.lock"
"""flock'ed around every read-modify-write of the lease."""
LINK_KEY_FILE = "node-link.key"
"""The secret of this launch's node link (0600, written by node 0): supervisor/link_auth.py."""
ATTEMPTS_DIR = "attempts"
"""Per-attempt files the supervisor hands to its ranks (the resolved config)."""
TENSORBOARD_DIR = "tb"

OWN_FILES = (METRICS_FILE, EVENTS_FILE, CONFIG_FILE, LEASE_FILE, LEASE_LOCK_FILE, LINK_KEY_FILE)
"""Files truestep writes directly in a run directory: each must be absent or a regular file."""
OWN_DIRS = (HEARTBEAT_DIR, CHECKPOINTS_DIR, ATTEMPTS_DIR, TENSORBOARD_DIR)
"""Directories truestep writes into: each must be absent or a real directory (not a symlink)."""


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    return run_dir / HEARTBEAT_DIR / HEARTBEAT_FILE.format(rank=rank)


def attempt_config_path(run_dir: Path, attempt: int, node: int) -> Path:
    return run_dir / ATTEMPTS_DIR / f"attempt{attempt:05d}-node{node}.toml"


# ---------------------------------------------------------------- host memory (resilience.snapshot_*)
SNAPSHOT_ROOT_DEFAULT = "/dev/shm/truestep-snapshots"
"""Where in-memory snapshots live when resilience.snapshot_dir is not set: tmpfs, i.e. host memory that
outlives a rank's process but not its host (checkpoint/memory/)."""
SNAPSHOT_HOLDER_DIR = "rank{rank:05d}"
"""One rank's snapshot memory on its host: its own copies and the copies it holds for its peers."""


def snapshot_host_dir(root: Path, run_id: str, host: str) -> Path:
    """This host's snapshot memory of the run `run_id` (a host's memory is its own: the host name is part
    of the path, so nodes that share a filesystem, as in the namespace test cluster, share nothing)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host).strip(".") or "host"
    return root / run_id / safe


def snapshot_holder_dir(root: Path, run_id: str, host: str, rank: int) -> Path:
    return snapshot_host_dir(root, run_id, host) / SNAPSHOT_HOLDER_DIR.format(rank=rank)


# ---------------------------------------------------------------- environment
ENV_FAULTS = "TRUESTEP_FAULTS"
"""';'-separated fault specs armed in every rank (docs/faults.md)."""
ENV_ATTEMPT = "TRUESTEP_ATTEMPT"
"""The job-wide attempt number (the run directory lease's incarnation) a supervisor gives its ranks."""
ENV_SUPERVISOR_PID = "TRUESTEP_SUPERVISOR_PID"
"""Set by the supervisor: its pid, which a rank checks is its parent (and dies with)."""
ENV_JOB_START = "TRUESTEP_JOB_START"
"""Wall-clock start of the whole job (across requeues): the origin of time-based faults."""
ENV_JOB_ID = "TRUESTEP_JOB_ID"
"""Identity of the job that owns the run directory lease (defaults to SLURM_JOB_ID)."""
ENV_JOB_GENERATION = "TRUESTEP_JOB_GENERATION"
"""Which launch of the job this is (a requeue is a new launch); defaults to SLURM_RESTART_COUNT, else 0.
Lets the nodes of a relaunched multi-node job tell node 0's new lease from the last launch's."""
ENV_CONFIG_FILE = "TRUESTEP_CONFIG_FILE"
"""Set by the supervisor: the resolved, validated config file of this attempt that ranks load."""
ENV_CONFIG_SHA256 = "TRUESTEP_CONFIG_SHA256"
"""Set by the supervisor: the SHA-256 of the attempt config file it wrote; the rank refuses a file that
differs (swapped after the supervisor wrote it)."""
ENV_RUN_DIR = "TRUESTEP_RUN_DIR"
"""Set by the supervisor: the run directory its ranks must train in (checked against their config)."""
ENV_DEBUG = "TRUESTEP_DEBUG"
"""Set (to 1) by `truestep --debug`: expected errors print their traceback too, in every process of the
job (the supervisor's ranks inherit it)."""
ENV_CACHE = "TRUESTEP_CACHE"
"""Where the built-in demo corpus is cached."""
