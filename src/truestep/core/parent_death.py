"""A child process that must not outlive its parent asks to die with it.

A parent killed with SIGKILL cannot clean up: a worker pool it started would wait on its task queue
forever (prepare-data's encoder workers did, ~89 MB each). So such a child, first thing, asks the
kernel for SIGKILL when its parent dies (Linux: PR_SET_PDEATHSIG), then checks that its parent is still
the one that started it: if that parent died before the request was made, the child is already an
orphan and says so. Elsewhere (no prctl) a daemon thread watches the parent's pid once a second.
Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
WATCH_S = 1.0
"""Without prctl: how often the watching thread checks the parent."""


def die_with_parent(parent: int) -> bool:
    """SIGKILL this process when `parent` (the pid that started it) dies. False when `parent` is already
    gone (the caller exits: it is an orphan)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        threading.Thread(target=_watch, args=(parent,), name="truestep-parent-watch", daemon=True).start()
    return os.getppid() == parent


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    os.kill(os.getpid(), signal.SIGKILL)


PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans(on: bool = True) -> bool:
    """Make this process a child subreaper (Linux: PR_SET_CHILD_SUBREAPER): a descendant whose parent
    exits becomes its child, not init's. The supervisor is one while a warm template forks its ranks
    (the template double-forks, so each rank is the supervisor's own child: it waits for it, and the rank
    dies with it). False where the kernel has no such request."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
