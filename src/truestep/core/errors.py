"""Exit codes of `truestep train` and `truestep launch`, and the error types that carry them.

Expected bad input (a config, a checkpoint, a busy run directory) raises a `TruestepError` subclass;
the CLI prints its message as one line on stderr and exits with its code. A traceback is printed only
with `--debug` (or goes to the event log); anything else is a bug and exits 1 with its traceback.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    """Finished."""
    FAILURE = 1
    """Crashed, or the supervisor gave up after max restarts."""
    USAGE = 2
    """Bad arguments or config: fix the command."""
    REFUSED = 3
    """An input is unusable or unsafe (checkpoint, data, resume, init_from): needs a human."""
    BUSY = 4
    """The run directory is leased by another live job."""
    FENCED = 5
    """A newer attempt owns the run directory: this (orphaned or partitioned) process stood aside."""
    REQUEUE = 75
    """Preempted gracefully, emergency checkpoint committed: requeue me (EX_TEMPFAIL)."""
    FORCED = 76
    """The graceful stop missed its deadline and exited hard: still requeue."""
    NODE_LOST = 77
    """Another node of a multi-node job is gone (crashed, partitioned, never joined): a restart on these
    nodes cannot succeed, so the scheduler must requeue the job (onto healthy nodes)."""
    INTERRUPTED = 130
    """Ctrl-C (SIGINT): emergency checkpoint committed, not requeued."""


NO_REQUEUE = (ExitCode.USAGE, ExitCode.REFUSED, ExitCode.BUSY, ExitCode.FENCED, ExitCode.INTERRUPTED)
"""Exit codes a scheduler must not requeue: retrying cannot help or would undo the user's decision."""


class TruestepError(Exception):
    """Expected bad input or state; the message says what, where, and what to do."""

    exit_code: ExitCode = ExitCode.REFUSED


class UsageError(TruestepError):
    exit_code = ExitCode.USAGE


class RefusedError(TruestepError):
    exit_code = ExitCode.REFUSED


class RunDirBusyError(TruestepError):
    exit_code = ExitCode.BUSY


class FencedError(TruestepError):
    exit_code = ExitCode.FENCED


class NodeLostError(TruestepError):
    exit_code = ExitCode.NODE_LOST
