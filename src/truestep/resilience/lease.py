"""One owner per run directory: an exclusive lease held by the job, and fencing by incarnation.

`lease.json` names the job that owns the run directory (job id, host, pid, boot id, process start time)
and its *incarnation*: the job-wide attempt number, bumped by the holder at every attempt (restart or
requeue) and handed to every rank. Every read-modify-write happens under `flock(.lease.lock)`.

- A second job is refused while the holder lives, with a message naming it. A holder on this host is
  alive iff its pid runs with the recorded start time (pid reuse and reboots are recognised); on another
  host (a shared filesystem), iff it renewed the lease within `ttl_s`.
- The same job's next launch (a SLURM requeue keeps its job id and counts SLURM_RESTART_COUNT, the
  launch's generation) takes over at once: the scheduler has ended the old launch, and whatever survives
  of it (an orphan, a partitioned node) is fenced. The same job id with no newer generation is no proof
  (two job steps of one allocation, an exported TRUESTEP_JOB_ID): refused like another job while the
  holder lives.
- Fencing: a writer checks that the lease still names its job and incarnation before it publishes
  (commit markers record the incarnation) and ranks check it every few seconds; a stale writer stops
  with exit code FENCED instead of writing into a directory the job has moved on from.
Released leases stay on disk (`released: true`) so incarnations keep counting across jobs.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from truestep.core.control_files import ControlFileError, read_control_json, read_log_tail, require
from truestep.core.errors import FencedError, RunDirBusyError
from truestep.core.fsio import atomic_write
from truestep.core.names import EVENTS_FILE, LEASE_FILE, LEASE_LOCK_FILE

LEASE_FORMAT = "truestep-lease"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks since boot (/proc/PID/stat field 22); None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


@dataclass
class Holder:
    job: str
    host: str
    boot_id: str
    pid: int
    pid_start: int | None
    incarnation: int
    acquired_at: float
    renewed_at: float
    generation: str = "0"
    """Which launch of the job holds it (`Launch.generation`: a requeue is a new launch). Lets the other
    nodes of a relaunched multi-node job tell node 0's new lease from the last launch's."""
    released: bool = False
    hub_port: int = 0
    """Multi-node jobs: the TCP port on node 0 where the other nodes' supervisors report (supervisor/peers.py)."""
    attempt_begun: bool = False
    """The holder has begun an attempt: `incarnation` is its number. Right after acquire it still holds
    the previous launch's number, which the other nodes must not start."""
    run_id: str = ""
    """The run directory's identity: a UUID made by the first lease taken on it and kept by every later
    holder. Commit markers record it, so checkpoints copied from another run directory are recognised
    (checkpoint/ownership.py). "" only in a lease written by an older truestep."""

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired_at))
        return f"job {self.job} (host {self.host}, pid {self.pid}, attempt {self.incarnation}, since {since})"

    def alive(self, ttl_s: float, now: float | None = None) -> bool:
        if self.released:
            return False
        if self.host == socket.gethostname() and self.boot_id == _boot_id():
            if not _pid_alive(self.pid):
                return False
            return self.pid_start is None or process_start_ticks(self.pid) == self.pid_start
        return (now or time.time()) - self.renewed_at < ttl_s


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_HOLDER_TYPES: dict[str, type | tuple[type, ...]] = {
    "job": str,
    "host": str,
    "boot_id": str,
    "pid": int,
    "pid_start": (int, type(None)),
    "incarnation": int,
    "acquired_at": (int, float),
    "renewed_at": (int, float),
    "generation": str,
    "released": bool,
    "hub_port": int,
    "attempt_begun": bool,
    "run_id": str,
}
"""Each lease field's type; a field of another type makes the lease unreadable (a string pid, ...)."""
_HOLDER_OPTIONAL = ("generation", "released", "hub_port", "attempt_begun", "run_id")
"""Fields a lease from an older truestep may lack (their defaults apply)."""


def read_lease(run_dir: Path) -> Holder | None:
    """The lease as recorded, or None when there is none. A lease that is not a regular file of sane
    size holding a well-typed truestep lease (a FIFO, a symlink, 16 GiB, a string pid) is refused with
    one line (RunDirBusyError naming it), never silently replaced: it may belong to a live job."""
    path = run_dir / LEASE_FILE
    try:
        data = read_control_json(path)
        if data is None:
            return None
        if data.get("format") != LEASE_FORMAT:
            raise ControlFileError(f"{path}: not a truestep lease")
        values = {
            key: require(data, path, key, kind)
            for key, kind in _HOLDER_TYPES.items()
            if key in data or key not in _HOLDER_OPTIONAL
        }
    except ControlFileError as err:
        raise RunDirBusyError(
            f"{err}; refusing to use it as the lease of {run_dir} (if no job uses it, delete it)"
        ) from None
    return Holder(**values)


def _last_attempt_in_events(run_dir: Path) -> int:
    """The highest attempt any record of events.jsonl names (a run directory from before leases). Only
    the log's tail is read (attempts only grow); a log that is not a regular file counts as none."""
    try:
        lines = read_log_tail(run_dir / EVENTS_FILE)
    except ControlFileError:
        return -1
    highest = -1
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        value = record.get("attempt") if isinstance(record, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > highest:
            highest = value
    return highest


class RunDirLease:
    """The holder's side: acquire, count attempts, renew, release."""

    def __init__(self, run_dir: Path, job: str, ttl_s: float, generation: str = "0") -> None:
        self.run_dir = run_dir
        self.job = job
        self.ttl_s = ttl_s
        self.generation = generation
        self.incarnation = -1
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(
            self.run_dir / LEASE_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, holder: Holder) -> None:
        record: dict[str, Any] = {"format": LEASE_FORMAT, **asdict(holder)}
        atomic_write(self.run_dir / LEASE_FILE, json.dumps(record, indent=1).encode())

    def acquire(self, hub_port: int = 0) -> Holder | None:
        """Take the lease or raise RunDirBusyError naming the live holder; returns the previous holder
        when one was taken over (for the event log). `hub_port` is published for the other nodes."""
        with self._locked():
            current = read_lease(self.run_dir)
            if current is not None and current.alive(self.ttl_s) and not self._may_take_over(current):
                same = " (the same job id: a second launch of a job is refused unless it is the job's next "
                same += (
                    "launch, with a newer generation / SLURM restart count)"
                    if current.job == self.job
                    else ""
                )
                raise RunDirBusyError(
                    f"run directory {self.run_dir} is in use by {current.describe()}{same}; wait for it to "
                    "end, or use another --run.dir"
                )
            floor = current.incarnation if current is not None else _last_attempt_in_events(self.run_dir)
            now = time.time()
            pid = os.getpid()
            mine = Holder(
                self.job,
                socket.gethostname(),
                _boot_id(),
                pid,
                process_start_ticks(pid),
                floor,
                now,
                now,
                self.generation,
                hub_port=hub_port,
                run_id=current.run_id if current is not None and current.run_id else uuid.uuid4().hex,
            )
            self._write(mine)
            self.incarnation = floor
        return current if current is not None and not current.released else None

    def _may_take_over(self, live: Holder) -> bool:
        """A live holder yields only to its own job's *next* launch: the same job id with a newer
        generation (a requeue: the scheduler has ended the old launch, whatever survives of it is
        fenced). The same job id alone proves nothing: two job steps of one SLURM allocation, or an
        exported TRUESTEP_JOB_ID, share it, and the second must not fence the first."""
        if live.job != self.job:
            return False
        if live.host == socket.gethostname() and live.pid == os.getpid():
            return True  # this very process, taking its own lease again
        return _is_newer(self.generation, live.generation)

    def begin_attempt(self) -> int:
        """Bump the incarnation: the number of the attempt about to start, job-wide."""
        with self._locked():
            current = self._still_mine()
            current.incarnation += 1
            current.attempt_begun = True
            current.renewed_at = time.time()
            self._write(current)
            self.incarnation = current.incarnation
        return self.incarnation

    def renew(self) -> None:
        with self._locked():
            current = self._still_mine()
            current.renewed_at = time.time()
            self._write(current)

    def release(self) -> None:
        self._stop.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            # A renewal under way finishes first (bounded: a hung filesystem must not keep a rank from
            # exiting; the renewal rewrites the record it read under the lock, never a released one as live).
            self._keeper.join(self.ttl_s / 4)
        with self._locked():
            current = read_lease(self.run_dir)
            if current is not None and current.job == self.job and current.pid == os.getpid():
                current.released = True
                self._write(current)

    def _still_mine(self) -> Holder:
        current = read_lease(self.run_dir)
        if current is None or current.job != self.job or current.pid != os.getpid():
            who = current.describe() if current else "nobody (the lease file is gone)"
            raise FencedError(f"lost the lease on {self.run_dir}: it now names {who}")
        return current

    def keep(self, on_lost: Callable[[FencedError], None]) -> None:
        """Renew every ttl/4 on a thread of its own; call `on_lost` once if the lease was taken."""

        def loop() -> None:
            while not self._stop.wait(self.ttl_s / 4):
                try:
                    self.renew()
                except FencedError as err:
                    on_lost(err)
                    return
                except OSError:  # a full disk or a flaky shared filesystem: renew again next period (the
                    continue  # fence is still checked before every commit; a lapsed lease only invites takeover)

        self._keeper = threading.Thread(target=loop, name="truestep-lease", daemon=True)
        self._keeper.start()


def _is_newer(mine: str, theirs: str) -> bool:
    """Generation `mine` provably comes after `theirs`: both counts (SLURM_RESTART_COUNT,
    TRUESTEP_JOB_GENERATION) and mine larger. Anything else (equal, or not both numbers) is not proof."""
    return mine.isdigit() and theirs.isdigit() and int(mine) > int(theirs)


def check_fence(
    run_dir: Path, job: str, incarnation: int, *, ended_ok: bool = False, generation: str = "0"
) -> None:
    """Raise FencedError unless the lease still names this job and incarnation, unreleased.

    `ended_ok` (the nodes other than node 0, ranks and supervisor): node 0's supervisor releasing the
    lease at the end of this very attempt of this launch is no fence. It ends a moment before the other
    nodes do after the same stop (a preemption's emergency save, a finished run); their ranks end the
    same way, and node 0's goodbye on the peer link says whether its end was orderly. Any later holder
    (another job, the next launch or attempt) fences them as usual."""
    current = read_lease(run_dir)
    if (
        ended_ok
        and current is not None
        and current.released
        and (current.job, current.generation, current.incarnation) == (job, generation, incarnation)
    ):
        return
    if current is None or current.job != job or current.incarnation != incarnation or current.released:
        who = current.describe() if current else "nobody (the lease file is gone)"
        raise FencedError(
            f"attempt {incarnation} of job {job} no longer owns {run_dir}: the lease names {who}; "
            "standing aside"
        )


def attempt_superseded(run_dir: Path, job: str, attempt: int, generation: str = "0") -> bool:
    """True when this launch of the job has started a newer attempt than `attempt` (node 0 restarted):
    the other nodes of the job follow it, where another job or another launch would fence them."""
    current = read_lease(run_dir)
    return (
        current is not None
        and not current.released
        and (current.job, current.generation) == (job, generation)
        and current.incarnation > attempt
    )


def await_attempt(
    run_dir: Path,
    job: str,
    after: int,
    timeout_s: float,
    poll_s: float = 0.1,
    check: Callable[[], None] | None = None,
    generation: str = "0",
) -> Holder:
    """Other nodes of a multi-node job: wait until node 0 of this launch of the job started an attempt
    newer than `after`; its incarnation is the number this node's ranks use too. `check` is called at
    every poll and may raise to stop waiting (node 0 is known to be gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        current = read_lease(run_dir)
        if (
            current is not None
            and (current.job, current.generation) == (job, generation)
            and current.attempt_begun
            and current.incarnation > after
            and not current.released
        ):
            return current
        if check is not None:
            check()
        if time.monotonic() > deadline:
            who = current.describe() if current else "no lease"
            raise FencedError(
                f"node 0 of job {job} did not start a new attempt within {timeout_s:.0f}s ({run_dir}: {who})"
            )
        time.sleep(poll_s)
