"""A failed rank's memory is lost with it: after tearing an attempt down, the supervisor removes the
snapshot memory of the ranks the failure names (resilience.snapshot_every_steps > 0), so the next attempt
restores them from a buddy's copy, or from disk when none holds one -- as on a real cluster, where a dead
process's (or host's) memory is gone. The survivors' memory stays: they restore from their own.

Which ranks: the one the failure names (a rank that hung, stopped beating, or died first) and every rank
killed by a signal the supervisor did not send (exit codes are read before its teardown kills the rest) --
but not a named rank that exited by itself with an exit code: it raised an error and its memory outlives
it, as tmpfs does. In a job of several nodes that is how the ranks of a surviving node end when a rank or
node elsewhere is lost ("a peer rank left the process group", exit 1), and their memory holds the only
surviving copies of the lost ranks' state (their buddies are on other nodes): dropping it would leave the
restore nothing (tests/test_memory_loss.py, tests/slurm/test_multinode_slurm.py).
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from truestep.config.schema import ResilienceConfig
from truestep.core.names import SNAPSHOT_ROOT_DEFAULT, snapshot_holder_dir
from truestep.resilience.lease import read_lease
from truestep.supervisor.watch import Failure


def lost_ranks(failure: Failure) -> list[int]:
    own_code = failure.exit_codes.get(failure.rank) if failure.rank is not None else None
    exited_itself = own_code is not None and own_code > 0
    named = {failure.rank} if failure.rank is not None and not exited_itself else set()
    killed = {rank for rank, code in failure.exit_codes.items() if code is not None and code < 0}
    return sorted(named | killed)


def forget_memory(cfg: ResilienceConfig, run_dir: Path, failure: Failure) -> list[int]:
    """Remove the lost ranks' snapshot memory on this host; the ranks whose memory was there."""
    if not cfg.snapshot_every_steps:
        return []
    holder = read_lease(run_dir)
    if holder is None or not holder.run_id:
        return []
    root = Path(cfg.snapshot_dir or SNAPSHOT_ROOT_DEFAULT)
    forgotten = []
    for rank in lost_ranks(failure):
        directory = snapshot_holder_dir(root, holder.run_id, socket.gethostname(), rank)
        if directory.is_dir() and not directory.is_symlink():
            shutil.rmtree(directory)
            forgotten.append(rank)
    return forgotten
