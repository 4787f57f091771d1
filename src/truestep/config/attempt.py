"""A supervised rank loads the attempt config its supervisor wrote, and only that.

The supervisor writes `attempts/attemptNNNNN-nodeK.toml` and passes its SHA-256 in the rank's launch
record (core/launch.py, TRUESTEP_CONFIG_SHA256). Anyone who can write the run directory could swap the
file between the write and the rank's read (pointing `checkpoint.dir` at another run's checkpoints, whose
retention would then delete them). The rank reads the file once, through the bounded no-follow reader
(a symlink, FIFO or oversize file is refused), hashes exactly the bytes it parses, and refuses a
mismatch (RefusedError, exit 3): what the supervisor handed over cannot be swapped.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from truestep.config.load import config_from_table, parse_toml, read_config_text
from truestep.config.schema import JobConfig
from truestep.core.errors import RefusedError


class AttemptConfigSwapped(RefusedError):
    """The attempt config file is not the one the supervisor wrote (exit 3)."""


def load_attempt_config(path: Path, sha256: str, overrides: list[str] | None = None) -> JobConfig:
    """The config in `path`, whose bytes must hash to `sha256` ("" = no hash handed over: an
    unsupervised rank given a config file, loaded as read)."""
    text = read_config_text(path, follow_symlinks=False)
    if sha256:
        actual = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if actual != sha256:
            raise AttemptConfigSwapped(
                f"the attempt config {path} is not the file the supervisor wrote (SHA-256 {actual[:16]}..., "
                f"expected {sha256[:16]}...): something else writes this run directory; refusing to train"
            )
    return config_from_table(parse_toml(text, str(path)), str(path), overrides)
