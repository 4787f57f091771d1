"""Exit codes of `truestep train` and `truestep launch`, and the error types that carry them.

Expected bad input (a config, a checkpoint, a busy run directory, a full disk) raises a `TruestepError`
subclass; the CLI prints its message as one line on stderr and exits with its code. A traceback is
printed only with `--debug` (or goes to the event log); anything else is a bug and exits 1 with its
traceback. `os_error_line` turns an OSError into that one line (what failed, where) so every command
says "no space left on device: PATH" the same way.
"""

from __future__ import annotations

import enum
import errno
import os
import sys
from typing import NoReturn


class ExitCode(enum.IntEnum):
    OK = 0
    """Finished."""
    FAILURE = 1
    """Crashed, or the supervisor gave up after max restarts."""
    USAGE = 2
    """Bad arguments or config: fix the command."""
    REFUSED = 3
    """An input is unusable or unsafe (checkpoint, data, resume, init_from, run directory): needs a human."""
    BUSY = 4
    """The run directory is leased by another live job."""
    FENCED = 5
    """A newer attempt owns the run directory: this (orphaned or partitioned) process stood aside."""
    STORAGE = 6
    """The filesystem refused a write (no space, quota, read-only, permission): free space or fix it,
    then resubmit; a requeue into the same full disk would only fail again."""
    INCOMPLETE = 8
    """`fidelity`, `goodput`, `experiment`, `report`, `demo`: the verdict is incomplete (evidence it needs
    is missing, or the floor has too few distinct repeats): neither correct nor shown wrong."""
    REQUEUE = 75
    """Preempted gracefully, emergency checkpoint committed: requeue me (EX_TEMPFAIL)."""
    FORCED = 76
    """The graceful stop missed its deadline and exited hard: still requeue."""
    NODE_LOST = 77
    """Another node of a multi-node job is gone (crashed, partitioned, never joined): a restart on these
    nodes cannot succeed, so the scheduler must requeue the job (onto healthy nodes)."""
    INTERRUPTED = 130
    """Ctrl-C (SIGINT): emergency checkpoint committed, not requeued."""


class Outcome(enum.StrEnum):
    """How a process ended -- a rank, a supervisor, a peer node -- classified once from its exit code
    (`of`), for everyone who acts on it: the supervisor (restart, stop, pass on), the peer link (did
    a node leave in order?), the node-loss rule (what survivors exit with), the experiment runner and
    the sbatch script (requeue?)."""

    CLEAN = "clean"
    """0: finished."""
    REQUEUE = "requeue"
    """The requeue code (`resilience.requeue_exit_code`, 75) or one above it (the forced exit, 76)."""
    REFUSED = "refused"
    """2, 3, 4: bad arguments or config, refused input, run directory in use."""
    FENCED = "fenced"
    """5: a newer attempt owns the run directory."""
    STORAGE = "storage"
    """6: the filesystem refused a write."""
    NODE_LOST = "node_lost"
    """77: another node of the job was lost."""
    INTERRUPTED = "interrupted"
    """130: Ctrl-C."""
    FAILED = "failed"
    """1, killed by a signal (negative, as subprocess reports it), or any other code."""

    @classmethod
    def of(cls, code: int, requeue_code: int = ExitCode.REQUEUE) -> Outcome:
        """The outcome of exit code `code`, where `requeue_code` is the configured requeue code."""
        if code in (requeue_code, requeue_code + 1):  # validated to be none of the codes below
            return cls.REQUEUE
        return _OUTCOME_OF_CODE.get(code, cls.FAILED)

    @property
    def orderly(self) -> bool:
        """It ended as it was asked to (finished, preempted, interrupted): not a failure of its attempt,
        and its peers end the same way."""
        return self in (Outcome.CLEAN, Outcome.REQUEUE, Outcome.INTERRUPTED)

    @property
    def retryable(self) -> bool:
        """Another attempt can change it: a supervisor may restart in place. Refusals, a fence and a
        refusing filesystem cannot be fixed by one: the supervisor stops and passes the code on."""
        return self not in (Outcome.REFUSED, Outcome.FENCED, Outcome.STORAGE)

    @property
    def requeue(self) -> bool:
        """A scheduler should requeue the job: preempted, a node lost, or failed. Never a refusal (a
        retry cannot help) or an interrupt (it would undo the user's decision)."""
        return self in (Outcome.REQUEUE, Outcome.NODE_LOST, Outcome.FAILED)


_OUTCOME_OF_CODE = {
    ExitCode.OK: Outcome.CLEAN,
    ExitCode.USAGE: Outcome.REFUSED,
    ExitCode.REFUSED: Outcome.REFUSED,
    ExitCode.BUSY: Outcome.REFUSED,
    ExitCode.FENCED: Outcome.FENCED,
    ExitCode.STORAGE: Outcome.STORAGE,
    ExitCode.NODE_LOST: Outcome.NODE_LOST,
    ExitCode.INTERRUPTED: Outcome.INTERRUPTED,
}
"""Every fixed code; the requeue code and 1/anything else are decided in `Outcome.of`."""

NOT_RETRYABLE = frozenset(code for code in ExitCode if not Outcome.of(code).retryable)
"""Rank exit codes another attempt cannot change: a supervisor stops and passes them on."""
NO_REQUEUE = tuple(sorted(c for c in ExitCode if c != ExitCode.OK and not Outcome.of(c).requeue))
"""Exit codes a scheduler must not requeue: retrying cannot help or would undo the user's decision
(scripts/slurm/train.sbatch's TRUESTEP_NO_REQUEUE_CODES default lists the same)."""


class TruestepError(Exception):
    """Expected bad input or state; the message says what, where, and what to do."""

    exit_code: ExitCode = ExitCode.REFUSED
    rank_local: bool = False
    """True when only the raising rank knows (its own file or stream): that rank prints the line, not
    only rank 0, which prints the refusals every rank shares."""


class UsageError(TruestepError):
    exit_code = ExitCode.USAGE


class RefusedError(TruestepError):
    exit_code = ExitCode.REFUSED


class RunDirBusyError(TruestepError):
    exit_code = ExitCode.BUSY


class FencedError(TruestepError):
    exit_code = ExitCode.FENCED


class StorageError(TruestepError):
    """The filesystem refused a write truestep needed (full, over quota, read-only, no permission)."""

    exit_code = ExitCode.STORAGE


STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})
"""errnos that mean "this filesystem will not take the write" rather than a transient fault."""


def causes(err: BaseException) -> list[BaseException]:
    """`err` and what it wraps: its cause/context chain, and the per-rank failures a DCP
    CheckpointException carries (`failures`: rank -> (exception, traceback)), depth first."""
    found: list[BaseException] = []
    pending: list[BaseException] = [err]
    while pending and len(found) < 64:
        current = pending.pop()
        if any(current is seen for seen in found):
            continue
        found.append(current)
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            for value in reversed(list(failures.values())):
                inner = value[0] if isinstance(value, tuple) and value else value
                if isinstance(inner, BaseException):
                    pending.append(inner)
        follow = current.__cause__ or current.__context__
        if follow is not None:
            pending.append(follow)
    return found


def os_error_in(err: BaseException) -> OSError | None:
    """The first OSError in `err` or what it wraps (see `causes`), if any."""
    return next((c for c in causes(err) if isinstance(c, OSError)), None)


def os_error_line(err: OSError, doing: str = "") -> str:
    """One line for an OSError: what was being done, the system's reason, and the path(s)."""
    reason = err.strerror or (os.strerror(err.errno) if err.errno else str(err)) or type(err).__name__
    where = ": ".join(str(p) for p in (err.filename, err.filename2) if p is not None)
    text = reason.lower() if reason[:1].isupper() and reason[1:2].islower() else reason
    return f"{doing + ': ' if doing else ''}{text}{': ' + where if where else ''}"


def storage_error(err: BaseException, doing: str = "") -> StorageError | None:
    """A StorageError for an error whose chain holds a full-disk/read-only/permission OSError, else None."""
    found = os_error_in(err)
    if found is None or found.errno not in STORAGE_ERRNOS:
        return None
    return StorageError(os_error_line(found, doing))


def expected_failure(err: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) when `err` is expected bad input or a refusing filesystem, else None (a bug,
    which keeps its traceback). A TruestepError anywhere in the chain counts, so does an OSError: a full
    disk is exit 6 and says "no space left on device: PATH", a symlink or FIFO where truestep reads or
    writes exit 3 (`UnsafePathError`), any other I/O error exit 1 and its reason."""
    if isinstance(err, TruestepError):
        return int(err.exit_code), str(err)
    storage = storage_error(err)
    if storage is not None:
        return int(storage.exit_code), str(storage)
    wrapped = next((c for c in causes(err) if isinstance(c, TruestepError)), None)
    if wrapped is not None:
        return int(wrapped.exit_code), str(wrapped)
    found = os_error_in(err)
    if isinstance(found, UnsafePathError):
        return int(ExitCode.REFUSED), f"refused: {os_error_line(found)}"
    if found is not None:
        return int(ExitCode.FAILURE), f"I/O error: {os_error_line(found)}"
    return None


class UnsafePathError(OSError):
    """A path truestep was about to read or write through is a symlink or not what it must be (a FIFO, a
    device, a file where a directory belongs): refused input (exit 3), however late in a run it is found --
    at start the same state is refused by the run directory check (core/rundir.py), and a retry cannot
    change it (exit 1 would be requeued forever). Raised by core/fsio.py."""


class NodeLostError(TruestepError):
    """Another node of the job is gone; this node stops so that the scheduler requeues the job."""

    exit_code = ExitCode.NODE_LOST


def end_process(exit_code: int) -> NoReturn:
    """Exit with `exit_code` through `os._exit`: a normal interpreter exit sometimes aborts in a C++
    destructor after training finished ("terminate called without an active exception", seen under
    gloo and, rarely, single-process with DCP's background threads), turning a finished run into a
    failed one. Only a process's entry point calls this (cli/train.py, a benchmark's worker), after its
    logs are closed and it left the process group."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
