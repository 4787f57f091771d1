"""One line on stderr, written in one call.

`print` writes the text and its newline separately, and with PYTHONUNBUFFERED (or `python -u`) each is
its own write(2): the supervisor's and the ranks' lines share one stderr, so another process's line can
land between a line and its newline ("...exit codes {1: -9})truestep train: rank 0: ..."). One write of
the whole line (far below PIPE_BUF) is never split on a pipe.
"""

from __future__ import annotations

import sys
from typing import TextIO


def say(line: str, out: TextIO | None = None) -> None:
    stream = out if out is not None else sys.stderr
    stream.write(line + "\n")
    stream.flush()
