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
verdict reaches them. Wire format: one JSON object per line. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from truestep.core.errors import ExitCode, NodeLostError, Outcome, UsageError

IO_TIMEOUT_S = 1.0
"""Socket operations never block a supervisor longer than this (a partitioned peer does not answer)."""
MAX_LINE = 65536


@dataclass
class NodeLoss:
    node: int
    host: str
    how: str
    """closed (connection ended without a goodbye), silent (no beat for node_timeout_s), left (goodbye
    with an exit code), never_joined, unreachable (node 0 could not be reached), rejected."""
    detail: str
    at: float = field(default_factory=time.time)
    """Wall clock when this supervisor learned of it."""
    code: int | None = None
    """The exit code the node left with (how == left)."""
    via: int | None = None
    """The node that reported it, when it was not seen directly (the hub passes losses on)."""

    def exit_code(self, requeue_code: int = ExitCode.REQUEUE) -> int:
        """What a survivor exits with: the code a departed node ended with when that says what to do
        (a refusal, a fence or a refusing filesystem a requeue cannot fix, an interrupt, a preemption
        with the job's `requeue_code`), else 77: requeue me."""
        if self.code is None:
            return ExitCode.NODE_LOST
        outcome = Outcome.of(self.code, requeue_code)
        follow = not outcome.retryable or outcome in (Outcome.REQUEUE, Outcome.INTERRUPTED)
        return self.code if follow else ExitCode.NODE_LOST

    def describe(self) -> str:
        via = f" (reported by node {self.via})" if self.via is not None else ""
        what = self.detail if self.how == "left" else f"lost: {self.how}: {self.detail}"
        return f"node {self.node} ({self.host or 'unknown host'}) {what}{via}"

    def to_event(self) -> dict[str, Any]:
        return {
            "lost_node": self.node,
            "lost_host": self.host,
            "how": self.how,
            "detail": self.detail,
            "lost_exit_code": self.code,
            "reported_by": self.via,
        }


class _Conn:
    """One peer connection: framed JSON lines, the time of the last message, thread-safe sends."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(IO_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.buffer = b""
        self.send_lock = threading.Lock()
        self.last_seen = time.monotonic()
        self.closed = False

    def send(self, message: dict[str, Any]) -> bool:
        data = (json.dumps(message) + "\n").encode()
        with self.send_lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(data)
                return True
            except OSError:  # timeout (a partitioned peer's window is full) or reset: judged by silence/EOF
                return False

    def receive(self, deadline: float | None = None) -> dict[str, Any] | None:
        """The next message; None when the connection ended (EOF, reset) or, with a (monotonic)
        `deadline`, when none came by then. Raises ValueError on garbage."""
        while b"\n" not in self.buffer:
            try:
                chunk = self.sock.recv(4096)
            except TimeoutError:
                if deadline is not None and time.monotonic() > deadline:
                    return None
                continue
            except OSError:
                return None
            if not chunk:
                return None
            self.buffer += chunk
            if len(self.buffer) > MAX_LINE:
                raise ValueError("line too long")
        line, self.buffer = self.buffer.split(b"\n", 1)
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("not a JSON object")
        self.last_seen = time.monotonic()
        return message

    def close(self) -> None:
        with self.send_lock:
            self.closed = True
        with contextlib.suppress(OSError):  # ENOTCONN: the peer is already gone, which is fine here
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@dataclass
class _Peer:
    node: int
    host: str = ""
    conn: _Conn | None = None
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
        message: dict[str, Any] = {"type": "bye", "code": int(code), "outcome": outcome}
        if loss is not None:
            message["lost"] = {
                "node": loss.node, "host": loss.host, "how": loss.how, "detail": loss.detail, "code": loss.code,
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

    def _read_forever(self, peer: _Peer, conn: _Conn) -> None:
        """Record beats and goodbyes until the connection ends; an end without goodbye is a loss."""
        how, detail = "closed", "connection closed without a goodbye: its supervisor died"
        while not self.stop.is_set():
            try:
                message = conn.receive()
            except (ValueError, UnicodeDecodeError) as err:
                how, detail = "closed", f"protocol error: {err}"
                break
            if message is None:
                break
            if message.get("type") == "bye":
                code = message.get("code")
                if not isinstance(code, int):
                    how, detail = "closed", f"protocol error: a goodbye without an exit code: {message}"
                    break
                self._on_bye(peer, code, str(message.get("outcome", "?")), message.get("lost"))
                return
        with self.lock:
            if peer.gone is None and not self.stop.is_set():
                peer.gone = NodeLoss(peer.node, peer.host, how, detail)

    def _on_bye(self, peer: _Peer, code: int, outcome: str, lost: Any) -> None:
        with self.lock:
            if peer.gone is None:
                peer.gone = NodeLoss(
                    peer.node, peer.host, "left", f"ended ({outcome}) with exit code {code}", code=code
                )
            if isinstance(lost, dict) and self.reported is None and lost.get("node") != self.node:
                self.reported = NodeLoss(
                    int(lost.get("node", -1)),
                    str(lost.get("host", "")),
                    str(lost.get("how", "?")),
                    str(lost.get("detail", "")),
                    code=lost.get("code") if isinstance(lost.get("code"), int) else None,
                    via=peer.node,
                )

    def _start_thread(self, target: Callable[..., None], *args: Any) -> None:
        threading.Thread(target=target, args=args, name="truestep-peers", daemon=True).start()


class Hub(PeerLink):
    """Node 0: accepts the other nodes' supervisors on a free port (published in the lease)."""

    def __init__(
        self,
        nnodes: int,
        job: str,
        generation: str,
        interval_s: float,
        timeout_s: float,
        join_timeout_s: float,
        requeue_code: int = ExitCode.REQUEUE,
    ) -> None:
        super().__init__(0, nnodes, job, generation, interval_s, timeout_s, requeue_code)
        self.join_timeout_s = join_timeout_s
        self.started = time.monotonic()
        self.peers = {k: _Peer(k) for k in range(1, nnodes)}
        self.listener = socket.create_server(("", 0), family=socket.AF_INET, backlog=max(8, nnodes))
        self.listener.settimeout(IO_TIMEOUT_S)
        self.port: int = self.listener.getsockname()[1]
        self._start_thread(self._accept_forever)
        self._start_thread(self._beat_forever)

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

    def _accept_forever(self) -> None:
        while not self.stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._start_thread(self._welcome, _Conn(sock))
        self.listener.close()

    def _welcome(self, conn: _Conn) -> None:
        try:
            hello = conn.receive(deadline=time.monotonic() + self.timeout_s)
        except (ValueError, UnicodeDecodeError):
            hello = None
        if hello is None or hello.get("type") != "hello":
            conn.close()  # not one of ours (a port scan, a stray client): ignore it
            return
        peer, problem = self._admit(hello, conn)
        if peer is None:
            conn.send({"type": "reject", "reason": problem})
            conn.close()
            return
        conn.send({"type": "welcome", "host": self.host})
        self._read_forever(peer, conn)

    def _admit(self, hello: dict[str, Any], conn: _Conn) -> tuple[_Peer | None, str]:
        """The peer this hello is from, now joined; or None and why it is refused."""
        node = hello.get("node")
        if (hello.get("job"), str(hello.get("generation"))) != (self.job, self.generation):
            return None, (
                f"it belongs to job {hello.get('job')} launch {hello.get('generation')}, "
                f"not job {self.job} launch {self.generation}"
            )
        if hello.get("nnodes") != self.nnodes:
            return None, f"it was started with --nnodes {hello.get('nnodes')}, node 0 with {self.nnodes}"
        if not isinstance(node, int) or node not in self.peers:
            return None, f"--node-rank {node} is not in 1..{self.nnodes - 1}"
        with self.lock:
            peer = self.peers[node]
            if peer.joined or peer.gone is not None:
                return (
                    None,
                    f"node {node} already joined (from {peer.host}): two launchers with one --node-rank",
                )
            peer.joined, peer.conn, peer.host = True, conn, str(hello.get("host", ""))
        return peer, ""

    def close(self, code: int, outcome: str, loss: NodeLoss | None = None) -> None:
        super().close(code, outcome, loss)
        self.listener.close()


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

    def join(self, addr: str, port: int, timeout_s: float) -> None:
        """Connect to node 0 (retrying until `timeout_s`); NodeLostError if it cannot be reached,
        UsageError if it refuses this node (wrong job, --nnodes, or a duplicate --node-rank)."""
        hub = self.peers[0]
        deadline = time.monotonic() + timeout_s
        last_error = "no attempt"
        while True:
            try:
                sock = socket.create_connection((addr, port), timeout=IO_TIMEOUT_S)
                conn = _Conn(sock)
                conn.send({"type": "hello", "node": self.node, "nnodes": self.nnodes, "job": self.job,
                           "generation": self.generation, "host": self.host})  # fmt: skip
                answer = conn.receive(deadline=time.monotonic() + self.timeout_s)
                if answer is not None:
                    break
                conn.close()
                last_error = "node 0 did not answer"
            except (OSError, ValueError) as err:
                last_error = str(err)
            if time.monotonic() > deadline:
                raise NodeLostError(
                    f"node 0's supervisor at {addr}:{port} cannot be reached within {timeout_s:g}s "
                    f"(resilience.startup_timeout_s): {last_error}"
                )
            time.sleep(0.2)
        if answer.get("type") == "reject":
            conn.close()
            raise UsageError(f"node 0 ({addr}) refused node {self.node}: {answer.get('reason')}")
        with self.lock:
            hub.joined, hub.conn, hub.host = True, conn, str(answer.get("host", addr))
        self._start_thread(self._read_forever, hub, conn)
        self._start_thread(self._beat_forever)


def make_link(
    node: int,
    nnodes: int,
    job: str,
    generation: str,
    interval_s: float,
    timeout_s: float,
    join_timeout_s: float,
    requeue_code: int,
) -> PeerLink | None:
    """The link for this node of the job: None for one node, the hub on node 0, a member elsewhere."""
    if nnodes <= 1:
        return None
    if node == 0:
        return Hub(nnodes, job, generation, interval_s, timeout_s, join_timeout_s, requeue_code)
    return Member(node, nnodes, job, generation, interval_s, timeout_s, requeue_code)
