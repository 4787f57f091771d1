"""The one exception type the data package raises for user-facing problems."""

from __future__ import annotations


class DataError(ValueError):
    """A data directory, input file, tokenizer or loader state is unusable.

    It subclasses ValueError so callers that already treat bad configuration as a ValueError keep
    working, while the CLI can catch exactly this type and print the message without a traceback.
    """
