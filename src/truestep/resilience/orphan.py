"""Ranks die with the supervisor that started them.

A SIGKILLed supervisor cannot clean up, and its ranks would train on, unsupervised, in the run directory
the scheduler's next attempt is about to use. So a supervised rank asks the kernel for SIGKILL when its
parent dies (PR_SET_PDEATHSIG) and then checks that its parent is still the supervisor that spawned it:
if the supervisor died before the request was made, the rank is already an orphan and exits at once.
Standard library only: this runs before torch is imported.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from truestep.core.errors import ExitCode

PR_SET_PDEATHSIG = 1


def die_with_supervisor(expected: int | None) -> None:
    """No-op unless started by a truestep supervisor (its pid, from the launch record); exits FENCED if
    that supervisor is already gone."""
    if expected is None:
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != expected:
        print(
            f"truestep train: the supervisor (pid {expected}) that started this rank is gone; exiting",
            file=sys.stderr,
            flush=True,
        )
        os._exit(ExitCode.FENCED)
