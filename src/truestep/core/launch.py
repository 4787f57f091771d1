"""Who a rank is: the launch record, and the one place the environment is read for it.

A rank learns who it is -- rank and world, node, attempt, job, launch generation, run directory, the
resolved config file, the rendezvous -- from one frozen `Launch`. It travels between processes as
environment variables, and only this module turns it into them (`to_env`) or reads it back
(`from_env`), validating every field: a malformed value is a one-line UsageError (exit 2), never a
traceback or a silent default.

Where a record comes from:
- `truestep launch` (the supervisor, also under SLURM): `Launch.for_rank` per rank and attempt; the
  rank's environment is the supervisor's plus `to_env()`; the warm template that forks it is handed the
  record whole (supervisor/standby.py, supervisor/handoff.py).
- torchrun, or a plain `truestep train`: `from_env` builds it from torchrun's RANK/WORLD_SIZE/... and
  the scheduler's SLURM_JOB_ID/SLURM_RESTART_COUNT; `attempt` is None and rank 0 begins one itself.

The process-wide TRUESTEP_* settings that are not a rank's identity (`--debug`, the demo cache) are read
here too, so that no other module reads a TRUESTEP_* variable. Standard library only: a rank reads its
record before torch is imported.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, fields, replace

from truestep.core.errors import UsageError
from truestep.core.names import (
    ENV_ATTEMPT,
    ENV_CACHE,
    ENV_CONFIG_FILE,
    ENV_CONFIG_SHA256,
    ENV_DEBUG,
    ENV_FAULTS,
    ENV_JOB_GENERATION,
    ENV_JOB_ID,
    ENV_JOB_START,
    ENV_RUN_DIR,
    ENV_SUPERVISOR_PID,
)

# torchrun's names (and the supervisor's, which sets the same): who this process is in the job.
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE = "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"
GROUP_RANK, MASTER_ADDR, MASTER_PORT = "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"
# The scheduler's: what a requeued SLURM job keeps (its id) and counts (its restarts).
SLURM_JOB_ID, SLURM_RESTART_COUNT = "SLURM_JOB_ID", "SLURM_RESTART_COUNT"

_ENV_NAMES = {
    "rank": RANK,
    "world_size": WORLD_SIZE,
    "local_rank": LOCAL_RANK,
    "local_world_size": LOCAL_WORLD_SIZE,
    "node": GROUP_RANK,
    "master_addr": MASTER_ADDR,
    "master_port": MASTER_PORT,
    "attempt": ENV_ATTEMPT,
    "job": ENV_JOB_ID,
    "generation": ENV_JOB_GENERATION,
    "job_start": ENV_JOB_START,
    "supervisor_pid": ENV_SUPERVISOR_PID,
    "run_dir": ENV_RUN_DIR,
    "config_file": ENV_CONFIG_FILE,
    "config_sha256": ENV_CONFIG_SHA256,
    "faults": ENV_FAULTS,
    "debug": ENV_DEBUG,
}
"""Launch field -> the environment variable that carries it."""

ID_LIMIT = 128
"""The longest job id or launch generation kept as it is. They are stored in the lease (a control file of
at most 64 KiB), the node link's hello (4 KiB) and every event: a longer one is kept as its first 48
characters and a SHA-256 (`bounded_id`), the same on every node, so a 100 KB id cannot make a supervisor
refuse its own lease."""


def bounded_id(text: str) -> str:
    """`text` when it is at most ID_LIMIT printable characters, else its first 48 printable characters,
    `~` and 32 hex digits of its SHA-256: distinct ids stay distinct, and the result maps to itself."""
    if len(text) <= ID_LIMIT and text.isprintable():
        return text
    head = "".join(ch for ch in text[:48] if ch.isprintable())
    return f"{head}~{hashlib.sha256(text.encode('utf-8', 'surrogateescape')).hexdigest()[:32]}"


PER_ATTEMPT = ("attempt", "master_port", "config_file", "config_sha256")
"""The fields that change from one attempt of a rank slot to the next."""
PER_ATTEMPT_ENV = tuple(_ENV_NAMES[name] for name in PER_ATTEMPT)
PER_RANK = ("rank", "local_rank")
"""The fields that tell a node's rank slots apart (its warm template, which forks every slot's rank,
learns them with the per-attempt ones when it forks a rank)."""
HANDED_ENV = tuple(_ENV_NAMES[name] for name in (*PER_RANK, *PER_ATTEMPT))
"""The only variables a forked rank may learn at its handoff: who it is in this attempt."""


class LaunchError(UsageError):
    """The environment a rank was started with does not describe a rank (exit 2)."""


@dataclass(frozen=True)
class Launch:
    """Everything a rank needs to know about who it is. Defaults: a single unsupervised process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node: int = 0
    """This rank's node in the job (GROUP_RANK)."""
    master_addr: str = ""
    """Rendezvous address ("" = not given: a single process needs none)."""
    master_port: int = 0
    """Rendezvous port (0 = not given)."""
    attempt: int | None = None
    """The job-wide attempt number (the lease's incarnation); None until rank 0 of an unsupervised job
    begins one (train/rank.py)."""
    job: str = ""
    """Identity of the job that owns the run directory lease ("" = not given: see `job_identity`)."""
    generation: str = "0"
    """Which launch of the job this is (a requeue is a new launch)."""
    job_start: float | None = None
    """Wall-clock start of the whole job (across requeues): the origin of time-based faults."""
    supervisor_pid: int | None = None
    """The supervisor that started this rank (it dies with it); None: torchrun or a plain train."""
    run_dir: str = ""
    """The run directory the supervisor runs this rank for ("" = the config's)."""
    config_file: str = ""
    """The resolved config file of this attempt the supervisor wrote for its ranks ("" = none)."""
    config_sha256: str = ""
    """SHA-256 (hex) of `config_file` as the supervisor wrote it; the rank loads it only if it matches
    (config/attempt.py). Required of a supervised rank with a config file."""
    faults: str = ""
    """';'-separated fault specs armed in this rank (docs/faults.md)."""
    debug: bool = False
    """`truestep --debug`: expected errors print their traceback too."""

    @property
    def supervised(self) -> bool:
        return self.supervisor_pid is not None

    def job_identity(self, fallback: str = "") -> str:
        """The job's identity: the record's (TRUESTEP_JOB_ID, else SLURM_JOB_ID), else `fallback`, else
        one unique to this process (a second such process is another job)."""
        return bounded_id(self.job or fallback or f"{socket.gethostname()}:{os.getpid()}:{time.time():.6f}")

    def with_faults(self, more: list[str]) -> Launch:
        """This record with `more` fault specs (`--fault`) armed after its own."""
        return replace(self, faults=";".join(filter(None, [self.faults, *more])))

    def for_rank(self, **changes: object) -> Launch:
        """A copy with `changes` applied and validated (the supervisor's record for one of its ranks)."""
        launch = replace(self, **changes)  # type: ignore[arg-type]
        launch.validate()
        return launch

    # --- the one writer and the one reader ---------------------------------------------------------

    def to_env(self) -> dict[str, str]:
        """The variables that carry this record; `Launch.from_env(launch.to_env()) == launch`. Fields
        at their "not given" value are left out, so a reader's default applies (SLURM's, torchrun's)."""
        env: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == "" or (f.name == "master_port" and value == 0):
                continue
            if f.name == "debug":
                if value:
                    env[ENV_DEBUG] = "1"
                continue
            env[_ENV_NAMES[f.name]] = str(value)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Launch:
        """The record this process was started with: from a supervisor's variables, torchrun's, the
        scheduler's (SLURM_JOB_ID, SLURM_RESTART_COUNT) or none (a single process). LaunchError (exit 2)
        when a variable is malformed or the fields contradict each other."""
        env = os.environ if environ is None else environ
        rank = _int(env, RANK, 0)
        world = _int(env, WORLD_SIZE, 1, low=1)
        launch = cls(
            rank=rank,
            world_size=world,
            local_rank=_int(env, LOCAL_RANK, rank),
            local_world_size=_int(env, LOCAL_WORLD_SIZE, world, low=1),
            node=_int(env, GROUP_RANK, 0),
            master_addr=env.get(MASTER_ADDR, ""),
            master_port=_int(env, MASTER_PORT, 0),
            attempt=_int(env, ENV_ATTEMPT, None),
            job=bounded_id(env.get(ENV_JOB_ID) or env.get(SLURM_JOB_ID) or ""),
            generation=bounded_id(env.get(ENV_JOB_GENERATION) or env.get(SLURM_RESTART_COUNT) or "0"),
            job_start=_float(env, ENV_JOB_START),
            supervisor_pid=_int(env, ENV_SUPERVISOR_PID, None, low=1),
            run_dir=env.get(ENV_RUN_DIR, ""),
            config_file=env.get(ENV_CONFIG_FILE, ""),
            config_sha256=env.get(ENV_CONFIG_SHA256, ""),
            faults=env.get(ENV_FAULTS, ""),
            debug=_debug_flag(env),
        )
        launch.validate()
        return launch

    def validate(self) -> None:
        # A world of one is a single process whatever RANK says (it builds no process group).
        if self.world_size > 1 and not 0 <= self.rank < self.world_size:
            raise LaunchError(f"{RANK}={self.rank} is not a rank of a job of {WORLD_SIZE}={self.world_size}")
        if self.world_size > 1 and not 0 <= self.local_rank < self.local_world_size:
            raise LaunchError(
                f"{LOCAL_RANK}={self.local_rank} is not a local rank of {LOCAL_WORLD_SIZE}="
                f"{self.local_world_size}"
            )
        if self.config_sha256 and not _is_sha256(self.config_sha256):
            raise LaunchError(f"{ENV_CONFIG_SHA256}={self.config_sha256!r:.80} is not a SHA-256 in hex")
        if self.supervised and self.config_file and not self.config_sha256:
            raise LaunchError(
                f"{ENV_CONFIG_FILE} is set but {ENV_CONFIG_SHA256} is not: a supervised rank loads only the "
                "attempt config its supervisor wrote and hashed"
            )
        if self.supervised and not self.job:
            raise LaunchError(
                f"{ENV_SUPERVISOR_PID} is set but {ENV_JOB_ID} is not: a supervised rank is started by "
                "`truestep launch`, which sets both"
            )

    def supervised_attempt(self) -> int | None:
        """The attempt a supervised rank was started for (None: unsupervised). LaunchError when the
        supervisor's record has none (a warm standby is parked without one until its handoff)."""
        if not self.supervised:
            return None
        if self.attempt is None:
            raise LaunchError(
                f"{ENV_SUPERVISOR_PID} is set but {ENV_ATTEMPT} is not: a supervised rank is started by "
                "`truestep launch`, which sets both"
            )
        return self.attempt


def _int(env: Mapping[str, str], name: str, default: int | None, low: int = 0) -> int | None:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if value < low:
        raise LaunchError(f"{name}={raw!r} is not an integer >= {low}")
    return value


def _float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "")
    if raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise LaunchError(f"{name}={raw!r} is not a number (a wall-clock time in seconds)")
    return value


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def without_launch(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without any variable a launch record owns: the base a rank's record is added to, so
    nothing of the starting process's own record (or a stale one) leaks into a rank's."""
    owned = set(_ENV_NAMES.values())
    return {k: v for k, v in environ.items() if k not in owned}


# --- process-wide settings (not a rank's identity) ---------------------------------------------------


def debug_requested(environ: Mapping[str, str] | None = None) -> bool:
    """`truestep --debug` was given to this process or to the one that started it (TRUESTEP_DEBUG=1).
    Never raises (it decides how an error is reported); `Launch.from_env` refuses a malformed value."""
    return (os.environ if environ is None else environ).get(ENV_DEBUG) == "1"


def _debug_flag(env: Mapping[str, str]) -> bool:
    raw = env.get(ENV_DEBUG, "")
    if raw not in ("", "0", "1"):
        raise LaunchError(f"{ENV_DEBUG}={raw!r} is not 1 or 0")
    return raw == "1"


def request_debug(environ: MutableMapping[str, str] | None = None) -> None:
    """`truestep --debug`: mark this process, and every process it starts, as debugging."""
    (os.environ if environ is None else environ)[ENV_DEBUG] = "1"


def cache_root(environ: Mapping[str, str] | None = None) -> str:
    """Where the user asked the demo corpus to be cached (TRUESTEP_CACHE), or "" for the default; an
    absolute path (after `~` expansion) or a one-line LaunchError. Who may write it is checked where the
    cache is used (data/demo.py)."""
    raw = (os.environ if environ is None else environ).get(ENV_CACHE, "")
    if raw and ("\0" in raw or not os.path.isabs(os.path.expanduser(raw))):
        raise LaunchError(f"{ENV_CACHE}={raw!r} is not an absolute directory path")
    return raw
