"""Which ranks' snapshot memory a failure takes with it (supervisor/memory_loss.py), in process: a rank
killed or hung loses it; a rank that exited by itself with an error keeps it -- in a job of several
nodes, the survivors of a loss elsewhere end that way and hold the only copies of the lost ranks."""

from __future__ import annotations

import socket
from pathlib import Path

from truestep.config.schema import ResilienceConfig
from truestep.core.names import snapshot_holder_dir
from truestep.resilience.lease import RunDirLease, read_lease
from truestep.supervisor.memory_loss import forget_memory, lost_ranks
from truestep.supervisor.watch import Failure


def test_a_killed_or_hung_rank_loses_its_memory() -> None:
    assert lost_ranks(Failure("process_exit", 1, "", {0: None, 1: -9})) == [1]
    assert lost_ranks(Failure("stale_heartbeat", 1, "", {0: None, 1: None})) == [1]  # stopped, not exited
    # Named for its error, but another rank was killed: the killed one is lost as well.
    assert lost_ranks(Failure("process_exit", 0, "", {0: 1, 1: -9})) == [1]


def test_a_rank_that_exited_by_itself_keeps_its_memory() -> None:
    """Node 0's rank after its peer on node 1 was killed or its node lost: exit 1, 'a peer rank left'."""
    assert lost_ranks(Failure("process_exit", 0, "exit codes {0: 1}", {0: 1})) == []
    assert lost_ranks(Failure("node_lost", None, "node 1 lost", {0: None})) == []


def test_the_supervisor_removes_only_the_lost_ranks_memory(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    RunDirLease(tmp_path, "job", ttl_s=60).acquire()  # the run's id, as the job's lease records it
    lease = read_lease(tmp_path)
    assert lease is not None and lease.run_id
    cfg = ResilienceConfig(snapshot_every_steps=1, snapshot_dir=str(root))
    holders = [snapshot_holder_dir(root, lease.run_id, socket.gethostname(), r) for r in (0, 1)]
    for holder in holders:
        holder.mkdir(parents=True)
        (holder / "c00000.0.bin").write_bytes(b"x")
    assert forget_memory(cfg, tmp_path, Failure("process_exit", 0, "", {0: 1})) == []
    assert forget_memory(cfg, tmp_path, Failure("process_exit", 1, "", {0: 1, 1: -9})) == [1]
    assert [h.is_dir() for h in holders] == [True, False]
