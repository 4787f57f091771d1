"""The one error type of the interop package."""

from __future__ import annotations

from truestep.core.errors import RefusedError


class InteropError(RefusedError):
    """An export/import refused: the message says what is wrong and, where it can, what to do."""
