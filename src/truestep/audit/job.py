"""One run of a foreign command, as a scheduler runs a job: started in its own process group, watched
through its logs, stopped from outside when a fault is due (SIGKILL of the whole group, or SIGTERM and
SIGKILL after a grace period), and started again on the same run directory until it exits 0 after its
last fault, within a bounded number of restarts. Every phase is timed with wall-clock stamps; the log
records each attempt made are attributed to it as they appear (rundir.py turns the result into a
truestep run directory).

A record belongs to the attempt during which it first appeared: each poll reads the logs whole and
takes the multiset difference with everything attributed so far, so a step that a restart logs again
(even with identical values) is a new record of the new attempt, while history a trainer copies from
its checkpoint (trainer_state.json) is not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from truestep.audit.readers import Record, read_logs
from truestep.audit.spec import FaultSpec, LogSpec, resolve_in, substitute
from truestep.audit.weights import WeightsFileError, weights_digest
from truestep.core.errors import UsageError
from truestep.core.fsio import make_dir, sha256_file

POLL_S = 0.1
"""Log polling period (stretched to twice the time a read takes, for large logs)."""
MAX_HASHED = 256 << 20
"""Files of the command line larger than this are named, not hashed."""
REAP_S = 10.0
"""How long the audit waits for a killed process group to be gone before it says so."""


def say(line: str) -> None:
    print(f"truestep audit: {line}", flush=True)


@dataclass
class Seen:
    record: Record
    seen: float
    """When the audit first read it."""


@dataclass
class Fired:
    spec: FaultSpec
    attempt: int
    time: float
    """When the signal was sent."""
    step: int | None
    """The highest step the attempt had logged then."""
    delivered: bool = True
    """False when the command had already exited: nothing was interrupted."""
    forced_at: float | None = None
    """term only: when the grace period ran out and the group was killed."""


@dataclass
class Attempt:
    number: int
    command: list[str]
    started: float
    records: list[Seen] = field(default_factory=list)
    exit_code: int | None = None
    exited: float | None = None
    down: float | None = None
    """When the whole process group was gone (None: something was still there after REAP_S)."""
    problems: list[str] = field(default_factory=list)
    """What the last read of the logs could not use."""
    pid: int | None = None
    """The command's process id (its group's leader): with `started`, which process this attempt was."""
    files: dict[str, str] = field(default_factory=dict)
    """Each argument of the command that names an existing file (the interpreter, the script, a config)
    -> its SHA-256 when the attempt started: the code's provenance, as far as a black box shows it."""

    @property
    def steps(self) -> list[int]:
        return [s.record.step for s in self.records]


@dataclass
class JobSpec:
    name: str
    role: str
    command: list[str]
    """With {run_dir} not yet replaced."""
    logs: LogSpec
    faults: list[FaultSpec] = field(default_factory=list)
    weights: str | None = None
    max_restarts: int = 4
    grace_s: float = 30.0
    timeout_s: float = 3600.0
    env: dict[str, str] | None = None
    """Extra environment variables for the command (tests set a trainer's switch this way)."""


@dataclass
class JobRecord:
    spec: JobSpec
    job_dir: Path
    started: float
    attempts: list[Attempt] = field(default_factory=list)
    fired: list[Fired] = field(default_factory=list)
    gave_up: str | None = None
    """Why the audit stopped restarting before the command finished (None: it finished)."""
    digest: str | None = None
    weights_problem: str | None = None

    @property
    def finished(self) -> bool:
        return self.gave_up is None


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _reap(pgid: int) -> float | None:
    """Kill what is left of the group (a scheduler ends the whole job) and wait until it is gone."""
    _signal_group(pgid, signal.SIGKILL)
    deadline = time.time() + REAP_S
    while time.time() < deadline:
        if _group_gone(pgid):
            return time.time()
        time.sleep(0.02)
    return None


class _Watcher:
    """Reads the logs and hands each attempt the records that are new."""

    def __init__(self, logs: LogSpec, job_dir: Path) -> None:
        self.logs, self.job_dir = logs, job_dir
        self.known: Counter[Record] = Counter()
        self.period = POLL_S

    def collect(self, attempt: Attempt) -> None:
        began = time.time()
        read = read_logs(self.logs, self.job_dir)
        now = time.time()
        self.period = max(POLL_S, 2 * (now - began))
        new = Counter(read.records) - self.known
        for record in read.records:
            if new[record] > 0:
                new[record] -= 1
                self.known[record] += 1
                attempt.records.append(Seen(record, now))
        attempt.problems = read.problems


def command_files(command: list[str]) -> dict[str, str]:
    """argument -> `sha256:<hex>` of the file it names (followed to its target: the user's own command
    line), `too large` beyond MAX_HASHED; arguments that name no regular file are left out."""
    found = {}
    for arg in dict.fromkeys(command):
        try:
            path = Path(arg).resolve()
            if not path.is_file():
                continue
            found[arg] = "too large" if path.stat().st_size > MAX_HASHED else "sha256:" + sha256_file(path)
        except (OSError, ValueError):
            continue  # not a file we can read: nothing to record
    return found


def _due(fault: FaultSpec, attempt: Attempt, now: float, job_start: float) -> bool:
    if fault.trigger == "time":
        return now - job_start >= fault.value
    return any(step >= fault.value for step in attempt.steps)


def _attempt(spec: JobSpec, job: JobRecord, number: int, watcher: _Watcher, log: Path) -> Attempt:
    command = substitute(spec.command, job.job_dir)
    env = {**os.environ, **(spec.env or {})}
    files = command_files(command)  # before the clock starts: hashing is the audit's time, not the job's
    with open(log, "a") as out:
        out.write(f"=== truestep audit: attempt {number}: {' '.join(command)}\n")
        out.flush()
        attempt = Attempt(number, command, time.time(), files=files)
        try:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        except OSError as err:  # not found, not executable: the command line is wrong, not the job
            raise UsageError(f"cannot start the command {command[0]!r}: {err.strerror or err}") from err
    pgid, term_deadline = proc.pid, None
    attempt.pid = proc.pid
    try:
        while proc.poll() is None:
            time.sleep(watcher.period)
            watcher.collect(attempt)
            now = time.time()
            if now - job.started > spec.timeout_s:
                job.gave_up = f"timed out after {spec.timeout_s:g} s (--timeout)"
                say(f"{spec.name}: {job.gave_up}; killing process group {pgid}")
                _signal_group(pgid, signal.SIGKILL)
                break
            if term_deadline is not None and now > term_deadline:
                job.fired[-1].forced_at = now
                say(f"{spec.name}: still running {spec.grace_s:g} s after SIGTERM; SIGKILL to group {pgid}")
                _signal_group(pgid, signal.SIGKILL)
                term_deadline = None
            pending = [f for f in spec.faults if not any(x.spec is f for x in job.fired)]
            fault = next((f for f in pending if _due(f, attempt, now, job.started)), None)
            if fault is None or term_deadline is not None or any(x.attempt == number for x in job.fired):
                continue
            step = max(attempt.steps, default=None)
            sig = signal.SIGKILL if fault.kind == "kill" else signal.SIGTERM
            delivered = proc.poll() is None and _signal_group(pgid, sig)
            job.fired.append(Fired(fault, number, time.time(), step, delivered))
            say(
                f"{spec.name}: {fault.text} fired in attempt {number} (the logs showed step {step}); "
                + (
                    f"{signal.Signals(sig).name} to process group {pgid}"
                    if delivered
                    else "but it had exited"
                )
            )
            if delivered and fault.kind == "term":
                term_deadline = time.time() + spec.grace_s
            elif delivered:
                proc.wait()  # SIGKILL cannot be caught: the exit is when the kernel has taken the process
        attempt.exit_code = proc.wait()
        attempt.exited = time.time()
    finally:
        if proc.poll() is None:  # the audit itself is stopping (Ctrl-C): leave nothing behind
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()
    attempt.down = _reap(pgid)
    if attempt.down is None:
        say(f"{spec.name}: process group {pgid} still had members {REAP_S:g} s after SIGKILL")
    watcher.collect(attempt)
    return attempt


def run_job(spec: JobSpec, run_dir: Path, log: Path) -> JobRecord:
    """Run the command on `run_dir/job` until it exits 0 after its last fault, or give up."""
    job_dir = run_dir / "job"
    make_dir(job_dir)
    job = JobRecord(spec, job_dir, time.time())
    watcher = _Watcher(spec.logs, job_dir)
    for number in range(spec.max_restarts + 1):
        if number:
            say(f"{spec.name}: restarting the command (restart {number} of at most {spec.max_restarts})")
        attempt = _attempt(spec, job, number, watcher, log)
        job.attempts.append(attempt)
        if job.gave_up is not None:
            return job
        faulted = any(f.attempt == number and f.delivered for f in job.fired)
        if attempt.exit_code == 0 and not faulted:
            break
        if not faulted:
            say(f"{spec.name}: attempt {number} exited {attempt.exit_code} with no fault injected")
    else:
        last = job.attempts[-1].exit_code
        job.gave_up = f"still not finished after {spec.max_restarts} restarts (last exit code {last})"
        say(f"{spec.name}: {job.gave_up}")
        return job
    if spec.weights is not None:
        path = resolve_in(spec.weights, job_dir)
        try:
            job.digest = weights_digest(path)
        except WeightsFileError as err:
            job.weights_problem = str(err)
    return job
