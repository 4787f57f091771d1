"""Ranks die with the supervisor that started them.

A SIGKILLed supervisor cannot clean up, and its ranks would train on, unsupervised, in the run directory
the scheduler's next attempt is about to use. So a supervised rank asks the kernel for SIGKILL when its
parent dies (PR_SET_PDEATHSIG) and then checks that its parent is still the supervisor that spawned it:
if the supervisor died before the request was made, the rank is already an orphan and exits at once.
Standard library only: this runs before torch is imported.
"""

from __future__ import annotations

import os
import sys

from truestep.core.errors import ExitCode
from truestep.core.parent_death import die_with_parent


def die_with_supervisor(expected: int | None) -> None:
    """No-op unless started by a truestep supervisor (its pid, from the launch record); exits FENCED if
    that supervisor is already gone."""
    if expected is None:
        return
    if not die_with_parent(expected):
        print(
            f"truestep train: the supervisor (pid {expected}) that started this rank is gone; exiting",
            file=sys.stderr,
            flush=True,
        )
        os._exit(ExitCode.FENCED)
