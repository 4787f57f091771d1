"""Which attempt this rank belongs to, and the fence that tells it when that attempt is over.

An attempt is begun in one place, `begin_attempt`: by node 0's supervisor (`truestep launch`, also
under SLURM) for its whole job, or by rank 0 of a job without one (torchrun, a plain `truestep train`).
It bumps the run directory lease's incarnation -- the job-wide attempt number -- and returns it with
its fence. A supervised rank learns its attempt from its launch record (`supervised_attempt`), checks
the lease still names it before it writes anything, and its heartbeat keeps checking. Standard library
only: it runs before torch is imported, so the first heartbeat is not delayed by imports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from truestep.core.launch import Launch
from truestep.resilience.lease import RunDirLease, check_fence


@dataclass
class Attempt:
    number: int
    """Job-wide attempt number: every record of this attempt carries it."""
    job: str
    fence: Callable[[], None]
    """Raises FencedError once the run directory belongs to a newer attempt or another job."""
    lease: RunDirLease | None = None
    """The lease, when this process holds it (a rank started without a supervisor)."""


def begin_attempt(lease: RunDirLease) -> Attempt:
    """Start the next attempt of the job that holds `lease` (node 0's supervisor, or rank 0 of an
    unsupervised job): bump the incarnation and return the attempt with its fence."""
    number = lease.begin_attempt()
    fence = partial(check_fence, lease.run_dir, lease.job, number, generation=lease.generation)
    return Attempt(number, lease.job, fence, lease)


def supervised_attempt(run_dir: Path, launch: Launch) -> Attempt | None:
    """The attempt the supervisor started this rank for (fence-checked now), or None when unsupervised."""
    number = launch.supervised_attempt()
    if number is None:
        return None
    # Ranks on node 0 end before their supervisor releases the lease; the other nodes' may outlive it.
    fence = partial(
        check_fence,
        run_dir,
        launch.job,
        number,
        ended_ok=launch.node != 0,
        generation=launch.generation,
    )
    fence()
    return Attempt(number, launch.job, fence)
