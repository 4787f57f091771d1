"""Are the other nodes of a multi-node job still there? The supervisors' own link, over the job's network.

A supervisor sees its own ranks fail, but a rank failing because a peer *node* is gone looks the same as
a local crash ("connection reset by peer"). The difference decides what to do: after a local crash every
node restarts in place; after a node loss a restart here can only wait for a peer that cannot come
back, so the survivors stop and let the scheduler requeue the job onto healthy nodes (exit 77).

So the supervisors keep a link of their own: node 0's supervisor (the hub) listens on a port it publishes
in the run directory lease; every other node's supervisor connects to it at MASTER_ADDR (the address its
ranks rendezvous at), and both sides send a beat every `heartbeat_interval_s`. A node is lost when
- its connection closes without a goodbye (its processes died: the kernel closes their sockets, which
  the peer sees within milliseconds; a node crash, an OOM kill of the supervisor), or
- it has been silent for `node_timeout_s` (a partition or a powered-off node: packets just vanish), or
- it never joined within `startup_timeout_s`, or it left with an exit code that ends the job.
A supervisor that ends says goodbye with its exit code, so peers can tell a finished or preempted node
from a lost one. The hub passes on which node was lost, so every survivor's event log names it.
Before a local restart, a supervisor requires a beat from every peer received *after* the failure:
the ranks of a crashing node may die a moment before its supervisor does.

Star topology (like the rendezvous): nodes other than 0 do not watch each other directly; the hub's
verdict reaches them. Only the job's own supervisors can speak on the link: a hello proves this launch's
secret by challenge-response and every later message is authenticated (supervisor/link_auth.py); node
0's front door bounds what strangers may cost (supervisor/link_gate.py); every field of a message is
checked before it is acted on (supervisor/link_messages.py). Wire format: one line per message, a MAC
and a JSON object. Standard library only.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from truestep.core.errors import ExitCode, NodeLostError, Outcome, TruestepError, UsageError
from truestep.supervisor.link_auth import Channel, LinkAuthError, hello_line, new_nonce, read_challenge
from truestep.supervisor.link_conn import IO_TIMEOUT_S, Conn, read_line
from truestep.supervisor.link_gate import HELLO_LIMIT, Gate
from truestep.supervisor.link_messages import (
    HOST_LIMIT,
    TEXT_LIMIT,
    Bye,
    LinkProtocolError,
    check_beat,
    check_bye,
    hello_problem,
)
from truestep.supervisor.node_loss import NodeLoss

KeySource = Callable[[], bytes | None]
"""Where a member gets this launch's key (None: node 0 has not published it yet)."""


class GateFailedError(TruestepError):
    """Node 0's front door on the link stopped (supervisor/link_gate.py): its port is closed, so a node
    that has not joined yet never can. A failure of this launch (exit 1, requeued), said in one line."""

    exit_code = ExitCode.FAILURE


@dataclass
class _Peer:
    node: int
    host: str = ""
    conn: Conn | None = None
    joined: bool = False
    gone: NodeLoss | None = None
    """Set once: how this peer left (a goodbye is recorded here too, with how == left)."""


class PeerLink:
    """Liveness of the other nodes, as seen by this node's supervisor (hub or member)."""

    def __init__(
        self,
        node: int,
        nnodes: int,
        job: str,
        generation: str,
        interval_s: float,
        timeout_s: float,
        requeue_code: int = ExitCode.REQUEUE,
    ) -> None:
        self.node = node
        self.nnodes = nnodes
        self.job = job
        self.generation = generation
        self.requeue_code = requeue_code
        """The job's `resilience.requeue_exit_code`: a goodbye with it (or one above) is a preemption."""
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.host = socket.gethostname()
        self.peers: dict[int, _Peer] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.reported: NodeLoss | None = None
        """A loss another node told us about (the hub's goodbye names the node it lost)."""

    # --- what the supervisor asks -------------------------------------------------------------------

    def check(self) -> NodeLoss | None:
        """During an attempt: a peer that is lost, or that left with a code that ends the job. A peer
        that left cleanly (finished, preempted) is not a loss: the local ranks end the same way."""
        now = time.monotonic()
        with self.lock:
            if self.reported is not None:
                return self.reported
            for peer in self.peers.values():
                if peer.gone is not None:
                    if peer.gone.how != "left" or not self._orderly(peer.gone.code):
                        return peer.gone
                elif peer.joined and peer.conn is not None and now - peer.conn.last_seen > self.timeout_s:
                    peer.gone = NodeLoss(
                        peer.node, peer.host, "silent", f"no beat for {now - peer.conn.last_seen:.1f}s "
                        f"(resilience.node_timeout_s={self.timeout_s:g}): partitioned or powered off",
                    )  # fmt: skip
                    return peer.gone
        return self._not_joined(now)

    def _not_joined(self, now: float) -> NodeLoss | None:
        return None

    def _orderly(self, code: int | None) -> bool:
        """A goodbye with this code ended in order (finished, preempted, interrupted): the local ranks
        end the same way."""
        return code is not None and Outcome.of(code, self.requeue_code).orderly

    def require_all(self, since: float, abort: Callable[[], object] | None = None) -> NodeLoss | None:
        """Before restarting in place: every peer must still be in the job and have sent a beat after
        `since` (monotonic), within node_timeout_s. Else the loss (a departed peer counts: without it a
        restart cannot succeed). `abort` is called while waiting and may raise to stop the wait."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            if abort is not None:
                abort()
            loss = self.check()
            if loss is not None:
                return loss
            with self.lock:
                departed = next((p.gone for p in self.peers.values() if p.gone is not None), None)
                waiting = [
                    p for p in self.peers.values() if not (p.joined and p.conn and p.conn.last_seen > since)
                ]
            if departed is not None:
                return departed
            if not waiting:
                return None
            if time.monotonic() > deadline:
                peer = waiting[0]
                with self.lock:
                    peer.gone = peer.gone or NodeLoss(
                        peer.node, peer.host, "silent", f"no beat within {self.timeout_s:g}s of a local "
                        "failure (resilience.node_timeout_s): partitioned or powered off",
                    )  # fmt: skip
                    return peer.gone
            time.sleep(0.02)

    def raise_if_gone(self) -> None:
        """Between attempts (a member waiting for node 0's next attempt): any departure or loss ends
        the wait with NodeLostError."""
        loss = self.check()
        if loss is None:
            with self.lock:
                loss = next((p.gone for p in self.peers.values() if p.gone is not None), None)
        if loss is not None:
            err = NodeLostError(loss.describe())
            # e.g. node 0 was preempted: so is this node (with the job's requeue code, maybe not an ExitCode)
            err.exit_code = loss.exit_code(self.requeue_code)  # type: ignore[assignment]
            raise err

    def close(self, code: int, outcome: str, loss: NodeLoss | None = None) -> None:
        """Say goodbye (with the exit code, and the lost node when that is why) and close."""
        message: dict[str, Any] = {"type": "bye", "code": int(code), "outcome": outcome[: TEXT_LIMIT // 16]}
        if loss is not None:
            message["lost"] = {
                "node": loss.node, "host": loss.host[:HOST_LIMIT], "how": loss.how,
                "detail": loss.detail[:TEXT_LIMIT], "code": loss.code,
            }  # fmt: skip
        self.stop.set()
        with self.lock:
            conns = [p.conn for p in self.peers.values() if p.conn is not None]
        for conn in conns:
            conn.send(message)
            conn.close()

    # --- shared machinery ---------------------------------------------------------------------------

    def _beat_forever(self) -> None:
        while not self.stop.wait(self.interval_s):
            with self.lock:
                conns = [p.conn for p in self.peers.values() if p.conn is not None and p.gone is None]
            for conn in conns:
                conn.send({"type": "beat", "node": self.node, "time": time.time()})

    def _read_forever(self, peer: _Peer, conn: Conn) -> None:
        """Record beats and goodbyes until the connection ends; an end without goodbye is a loss, and so
        is a message that is not authenticated or not well-formed (a bug or a tampered stream)."""
        how, detail = "closed", "connection closed without a goodbye: its supervisor died"
        while not self.stop.is_set():
            try:
                message = conn.receive()
                if message is None:
                    break
                kind = message.get("type")
                if kind == "beat":
                    check_beat(message, peer.node)
                    continue
                if kind != "bye":
                    raise LinkProtocolError(f"unknown message type {str(kind)[:40]!r}")
                bye = check_bye(message, peer.node, self.node, self.nnodes, self.requeue_code)
            except (LinkAuthError, LinkProtocolError) as err:
                how, detail = "closed", f"protocol error: {err}"
                break
            self._on_bye(peer, bye)
            return
        with self.lock:
            if peer.gone is None and not self.stop.is_set():
                peer.gone = NodeLoss(peer.node, peer.host, how, detail)
        conn.close()

    def _on_bye(self, peer: _Peer, bye: Bye) -> None:
        with self.lock:
            if peer.gone is None:
                detail = f"ended ({bye.outcome}) with exit code {bye.code}"
                peer.gone = NodeLoss(peer.node, peer.host, "left", detail, code=bye.code)
            lost = bye.lost
            if lost is not None and self.reported is None and lost.node != self.node:
                self.reported = NodeLoss(
                    lost.node, lost.host, lost.how, lost.detail, code=lost.code, via=peer.node
                )

    def _start_thread(self, target: Callable[..., None], *args: Any) -> None:
        threading.Thread(target=target, args=args, name="truestep-peers", daemon=True).start()


class Hub(PeerLink):
    """Node 0: accepts the other nodes' supervisors on a free port (published in the lease), through a
    gate that admits only a hello proving `key`, this launch's secret (published in the run directory)."""

    def __init__(
        self,
        nnodes: int,
        job: str,
        generation: str,
        interval_s: float,
        timeout_s: float,
        join_timeout_s: float,
        requeue_code: int = ExitCode.REQUEUE,
        key: bytes = b"",
    ) -> None:
        super().__init__(0, nnodes, job, generation, interval_s, timeout_s, requeue_code)
        if len(key) < 16:
            raise ValueError("the node link needs this launch's secret (link_auth.new_key())")
        self.key = key
        self.join_timeout_s = join_timeout_s
        self.started = time.monotonic()
        self.peers = {k: _Peer(k) for k in range(1, nnodes)}
        listener = socket.create_server(("", 0), family=socket.AF_INET, backlog=max(64, nnodes))
        self.port: int = listener.getsockname()[1]
        self.gate = Gate(listener, key, self._admit, self.stop)
        self._start_thread(self.gate.serve)
        self._start_thread(self._beat_forever)

    @property
    def refused(self) -> dict[str, int]:
        """Connections dropped before they proved the key, by reason."""
        return dict(self.gate.refused)

    @property
    def gate_errors(self) -> list[str]:
        """The latest errors that dropped a connection at the gate (its `error` count)."""
        return list(self.gate.errors)

    def check(self) -> NodeLoss | None:
        """As a member's, and first: GateFailedError when the gate's loop has stopped (a closed port must
        not look like a node that merely never joined)."""
        if self.gate.failure is not None:
            raise GateFailedError(
                f"node 0's node link gate stopped ({self.gate.failure}): its port is closed, so no node can "
                "join; ending this launch (exit 1: requeue it)"
            )
        return super().check()

    def _not_joined(self, now: float) -> NodeLoss | None:
        if now - self.started <= self.join_timeout_s:
            return None
        with self.lock:
            missing = [p for p in self.peers.values() if not p.joined and p.gone is None]
            if not missing:
                return None
            peer = missing[0]
            peer.gone = NodeLoss(
                peer.node, "", "never_joined", f"its supervisor did not report within {self.join_timeout_s:g}s "
                "(resilience.startup_timeout_s): not started, or cannot reach node 0",
            )  # fmt: skip
            return peer.gone

    def _admit(self, sock: socket.socket, hello: dict[str, Any], channel: Channel, rest: bytes) -> None:
        """A hello that proved the key: join its node, or refuse it (sealed, so the member can trust it)."""
        conn = Conn(sock, channel, rest)
        problem = hello_problem(hello, self.job, self.generation, self.nnodes)
        peer = None
        if problem is None:
            with self.lock:
                peer = self.peers[hello["node"]]
                if peer.joined or peer.gone is not None:
                    problem = f"node {peer.node} already joined (from {peer.host}): two launchers with one --node-rank"
                    peer = None
                else:
                    peer.joined, peer.conn, peer.host = True, conn, hello["host"]
        if peer is None:
            conn.send({"type": "reject", "reason": problem})
            conn.close()
            return
        conn.send({"type": "welcome", "host": self.host})
        self._start_thread(self._read_forever, peer, conn)


class Member(PeerLink):
    """Node k > 0: reports to node 0's supervisor at MASTER_ADDR."""

    def __init__(
        self,
        node: int,
        nnodes: int,
        job: str,
        generation: str,
        interval_s: float,
        timeout_s: float,
        requeue_code: int = ExitCode.REQUEUE,
    ) -> None:
        super().__init__(node, nnodes, job, generation, interval_s, timeout_s, requeue_code)
        self.peers = {0: _Peer(0)}

    def join(self, addr: str, port: int, timeout_s: float, key: KeySource) -> None:
        """Connect to node 0 and prove this launch's key (retrying until `timeout_s`); NodeLostError if it
        cannot be reached or will not prove the key in turn, UsageError if it refuses this node (wrong job,
        --nnodes, or a duplicate --node-rank)."""
        deadline = time.monotonic() + timeout_s
        last_error = "no attempt"
        while True:
            try:
                secret = key()
                answer = self._hello(addr, port, secret) if secret is not None else None
                if answer is not None:
                    break
                last_error = (
                    "node 0 has not published this launch's node link key yet" if secret is None else
                    "node 0 closed the connection without proving the key: its launch's key is not the one "
                    "this node read (another launch?)"
                )  # fmt: skip
            except (OSError, LinkAuthError) as err:
                last_error = str(err)
            if time.monotonic() > deadline:
                raise NodeLostError(
                    f"node 0's supervisor at {addr}:{port} cannot be reached within {timeout_s:g}s "
                    f"(resilience.startup_timeout_s): {last_error}"
                )
            time.sleep(0.2)
        conn, message = answer
        if message.get("type") == "reject":
            conn.close()
            raise UsageError(f"node 0 ({addr}) refused node {self.node}: {str(message.get('reason'))[:500]}")
        if message.get("type") != "welcome" or not isinstance(message.get("host", addr), str):
            conn.close()
            raise NodeLostError(f"node 0 ({addr}) answered the hello with {str(message)[:200]}")
        hub = self.peers[0]
        with self.lock:
            hub.joined, hub.conn, hub.host = True, conn, str(message.get("host", addr))[:255]
        self._start_thread(self._read_forever, hub, conn)
        self._start_thread(self._beat_forever)

    def _hello(self, addr: str, port: int, key: bytes) -> tuple[Conn, dict[str, Any]] | None:
        """One handshake: the authenticated connection and node 0's sealed answer, or None when node 0
        closed it or did not answer in time. LinkAuthError when the answer does not prove the key."""
        sock = socket.create_connection((addr, port), timeout=IO_TIMEOUT_S)
        answer_by = time.monotonic() + self.timeout_s
        try:
            line, rest = read_line(sock, b"", HELLO_LIMIT, answer_by)
            if line is None:
                sock.close()
                return None
            challenge, nonce = read_challenge(line), new_nonce()
            hello = {"type": "hello", "node": self.node, "nnodes": self.nnodes, "job": self.job,
                     "generation": self.generation, "host": self.host, "nonce": nonce}  # fmt: skip
            sock.sendall(hello_line(key, challenge, hello))
            conn = Conn(sock, Channel(key, challenge, nonce, is_hub=False), rest)
            message = conn.receive(deadline=answer_by)
        except BaseException:
            sock.close()
            raise
        if message is None:
            conn.close()
        return (conn, message) if message is not None else None


def make_link(
    node: int,
    nnodes: int,
    job: str,
    generation: str,
    interval_s: float,
    timeout_s: float,
    join_timeout_s: float,
    requeue_code: int,
    key: bytes,
) -> PeerLink | None:
    """The link for this node of the job: None for one node, the hub on node 0 (admitting only hellos
    that prove `key`), a member elsewhere (which reads the key when it joins)."""
    if nnodes <= 1:
        return None
    if node == 0:
        return Hub(nnodes, job, generation, interval_s, timeout_s, join_timeout_s, requeue_code, key)
    return Member(node, nnodes, job, generation, interval_s, timeout_s, requeue_code)
