"""The one error type of the interop package."""

from __future__ import annotations


class InteropError(RuntimeError):
    """An export/import/init_from refused: the message says what is wrong and, where it can, what to do."""
