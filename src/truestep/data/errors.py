"""The one exception type the data package raises for user-facing problems."""

from __future__ import annotations

from truestep.core.errors import ExitCode, RefusedError


class DataError(RefusedError, ValueError):
    """A data directory, input file, tokenizer or loader state is unusable.

    A RefusedError, so the CLI prints the message as one line and exits with code 3; still a
    ValueError for callers that treat bad input as one.
    """


class DataUsageError(DataError):
    """A path named on the command line is missing, unreadable or not usable as named (exit 2: fix the
    command), as opposed to bad data inside an input (exit 3)."""

    exit_code = ExitCode.USAGE
