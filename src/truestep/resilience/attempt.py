"""Which attempt this rank belongs to, and the fence that tells it when that attempt is over.

Under `truestep launch` the supervisor holds the run directory lease and hands every rank the job id
and the attempt number (the lease's incarnation); the rank checks the lease still names them before it
writes anything, and its heartbeat keeps checking. Standard library only: it runs before torch is
imported, so the first heartbeat is not delayed by imports.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from truestep.core.names import ENV_ATTEMPT, ENV_JOB_ID
from truestep.resilience.lease import RunDirLease, check_fence
from truestep.resilience.orphan import supervisor_pid


@dataclass
class Attempt:
    number: int
    """Job-wide attempt number: every record of this attempt carries it."""
    job: str
    fence: Callable[[], None]
    """Raises FencedError once the run directory belongs to a newer attempt or another job."""
    lease: RunDirLease | None = None
    """The lease, when this process holds it (a rank started without a supervisor)."""


def supervised_attempt(run_dir: Path) -> Attempt | None:
    """The attempt the supervisor started this rank for (fence-checked now), or None when unsupervised."""
    if supervisor_pid() is None:
        return None
    number, job = int(os.environ[ENV_ATTEMPT]), os.environ[ENV_JOB_ID]
    # Ranks on node 0 end before their supervisor releases the lease; the other nodes' may outlive it.
    fence = partial(check_fence, run_dir, job, number, ended_ok=os.environ.get("GROUP_RANK", "0") != "0")
    fence()
    return Attempt(number, job, fence)
