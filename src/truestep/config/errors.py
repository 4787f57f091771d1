"""The config package's error type (its own module so load and validate can both raise it)."""

from __future__ import annotations

from truestep.core.errors import UsageError


class ConfigError(UsageError, ValueError):
    """A config problem the user can fix; the message says how. Exit code 2."""
