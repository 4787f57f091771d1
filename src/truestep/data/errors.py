"""The one exception type the data package raises for user-facing problems."""

from __future__ import annotations

from truestep.core.errors import RefusedError


class DataError(RefusedError, ValueError):
    """A data directory, input file, tokenizer or loader state is unusable.

    A RefusedError, so the CLI prints the message as one line and exits with code 3; still a
    ValueError for callers that treat bad input as one.
    """
