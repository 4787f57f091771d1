"""A supervisor's view of the rest of its job: the other nodes, and whether the job has moved on.

What one node's supervisor cannot see in its own ranks, in one place, so that the restart loop
(supervisor/restart_loop.py) asks three questions and nothing more:
- during an attempt (`check`, every poll): is a peer node gone (supervisor/peers.py)? Has the job moved
  on without this node -- the lease names another launch or job (fenced: stand aside, exit 5) -- or
  has node 0 merely started the next attempt of this launch (follow it: tear down, restart in place)?
- when a rank exited FENCED (`rank_fenced`): was it fenced, or did it just see node 0's restart first?
- before restarting in place after a local failure (`before_restart`): is the job still this node's,
  and is every other node still there (each must send a beat after the failure)? A node lost here
  stops this node for a requeue (exit 77) instead of waiting for a peer that cannot come back.
The lease is re-read every FENCE_CHECK_S (a small file on the shared filesystem).
"""

from __future__ import annotations

import time
from pathlib import Path

from truestep.config.schema import ResilienceConfig
from truestep.core.errors import FencedError
from truestep.resilience.attempt import begin_attempt
from truestep.resilience.heartbeat import FENCE_CHECK_S
from truestep.resilience.lease import (
    RunDirLease,
    attempt_superseded,
    await_attempt,
    check_fence,
)
from truestep.supervisor.link_auth import new_key, read_key, remove_key, write_key
from truestep.supervisor.node_loss import NodeLoss
from truestep.supervisor.peers import Hub, Member, make_link
from truestep.supervisor.watch import Failure, FailureKind


class JobNodes:
    def __init__(
        self,
        run_dir: Path,
        job: str,
        node: int,
        nnodes: int,
        master_addr: str,
        cfg: ResilienceConfig,
        generation: str = "0",
    ) -> None:
        self.run_dir = run_dir
        self.job = job
        self.generation = generation
        self.node = node
        self.master_addr = master_addr
        self.cfg = cfg
        self.link_key = new_key() if node == 0 else b""
        """This launch's node link secret (node 0 draws it; `publish_key` writes it for the others)."""
        self.peers = (
            make_link(node, nnodes, job, generation, cfg.heartbeat_interval_s, cfg.node_timeout_s,
                      cfg.startup_timeout_s, cfg.requeue_exit_code, self.link_key)
            if cfg.node_watch
            else None
        )  # fmt: skip
        self.hub_port = self.peers.port if isinstance(self.peers, Hub) else 0
        """Published in the lease by node 0, so the other nodes' supervisors can report to it."""
        self.loss: NodeLoss | None = None
        """The node whose loss stopped this one (passed on to the peers in the goodbye)."""
        self._fence_checked = 0.0

    def publish_key(self) -> None:
        """Node 0, once it holds the run directory lease and before its first attempt: write this launch's
        link secret (0600) where the job's other nodes, and nobody else, can read it."""
        if isinstance(self.peers, Hub):
            write_key(self.run_dir, self.job, self.generation, self.link_key)

    @property
    def link_refused(self) -> dict[str, int]:
        """Connections node 0's link dropped before they proved the key, by reason (none elsewhere)."""
        return self.peers.refused if isinstance(self.peers, Hub) else {}

    @property
    def link_errors(self) -> list[str]:
        """The latest errors that made node 0's link drop a connection (its `error` count), for the end event."""
        return self.peers.gate_errors if isinstance(self.peers, Hub) else []

    # --- between attempts ---------------------------------------------------------------------------

    def next_attempt(self, lease: RunDirLease, after: int) -> tuple[int, str | None]:
        """The number of the attempt to start: node 0 begins it, the others wait for node 0 (and, the
        first time, join its link). Returns (attempt, where this node joined node 0 or None)."""
        if self.node == 0:
            return begin_attempt(lease).number, None
        timeout = self.cfg.startup_timeout_s
        member = self.peers if isinstance(self.peers, Member) else None
        joined = member is not None and member.peers[0].joined
        check = member.raise_if_gone if member is not None and joined else None
        holder = await_attempt(
            self.run_dir, self.job, after, timeout, check=check, generation=self.generation
        )
        if member is None or joined:
            return holder.incarnation, None
        member.join(
            self.master_addr,
            holder.hub_port,
            timeout,
            key=lambda: read_key(self.run_dir, self.job, self.generation),
        )
        return holder.incarnation, f"{self.master_addr}:{holder.hub_port}"

    def before_restart(self, attempt: int, since: float) -> Failure | None:
        """After a local failure (detected at monotonic `since`): raises FencedError when the job moved
        on without this node; returns a node_lost Failure when another node is gone; else None."""
        self._lease(attempt)
        if self.peers is None:
            return None
        loss = self.peers.require_all(since, abort=lambda: self._lease(attempt))
        return self._lost(loss) if loss is not None else None

    # --- during an attempt --------------------------------------------------------------------------

    def check(self, attempt: int) -> Failure | None:
        """Every poll: a node_lost or attempt_superseded Failure, None, or FencedError. Node 0 releasing
        the lease at the end of this very attempt is no fence: it ended a moment before this node's ranks
        (a preemption's emergency save, a finished run), and they end the same way."""
        if time.monotonic() - self._fence_checked >= FENCE_CHECK_S:
            self._fence_checked = time.monotonic()
            superseded = self._lease(attempt, ended_ok=True)
            if superseded is not None:
                return superseded
        loss = self.peers.check() if self.peers is not None else None
        return self._lost(loss) if loss is not None else None

    def rank_fenced(self, attempt: int) -> Failure | None:
        """A rank exited FENCED: the attempt_superseded Failure when node 0 only started the next attempt
        of this launch (follow it), None when the job really moved on (stand aside)."""
        return self._superseded(attempt) if self._follows(attempt) else None

    # --- the end ------------------------------------------------------------------------------------

    def close(self, code: int, outcome: str) -> None:
        """Say goodbye to the other nodes with this node's exit code (and the lost node, if any)."""
        if self.peers is not None:
            self.peers.close(code, outcome, self.loss)
        if isinstance(self.peers, Hub):
            remove_key(self.run_dir, self.link_key)

    # --- helpers ------------------------------------------------------------------------------------

    def _lease(self, attempt: int, ended_ok: bool = False) -> Failure | None:
        try:
            check_fence(
                self.run_dir,
                self.job,
                attempt,
                ended_ok=ended_ok and self.node != 0,
                generation=self.generation,
            )
        except FencedError:
            if self._follows(attempt):
                return self._superseded(attempt)
            raise
        return None

    def _follows(self, attempt: int) -> bool:
        return self.node != 0 and attempt_superseded(self.run_dir, self.job, attempt, self.generation)

    @staticmethod
    def _superseded(attempt: int) -> Failure:
        return Failure(
            FailureKind.ATTEMPT_SUPERSEDED,
            None,
            f"node 0 started the next attempt after {attempt}: following it",
        )

    def _lost(self, loss: NodeLoss) -> Failure:
        self.loss = loss
        return Failure(FailureKind.NODE_LOST, None, loss.describe(), loss=loss)
