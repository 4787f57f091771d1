"""Node 0's front door on the node link: what a connection gets before it has proven the launch's key.

One thread and non-blocking sockets, so strangers cost neither threads nor unbounded descriptors:
- at most MAX_PENDING connections wait for their hello at once, MAX_PENDING_PER_SOURCE from one address;
  a new one over either limit evicts the oldest waiting one (of its address, else of all): holding the
  slots then takes a flood faster than a real node's handshake (one round trip), not a trickle of
  connections that just sit there;
- each gets a fresh challenge and HELLO_DEADLINE_S for its whole hello, however it trickles in (a slow
  sender is dropped at the deadline), and at most HELLO_LIMIT bytes without a line end;
- its hello's MAC is checked before a byte of it is parsed (supervisor/link_auth.py); a hello that does
  not prove the key is dropped without an answer. Only a proven hello reaches `admit`, which decides
  (and answers, sealed) whether this node may join.
Nothing an unauthenticated connection sends can change the job: it is counted (`refused`) and dropped.

The loop survives anything one connection does: an event for a connection dropped earlier in the same
`select()` batch (evicted by a newer one) is ignored, and any error while handling one connection drops
that connection (counted as `error`), never the gate. Should the loop itself fail anyway, the gate
records why (`failure`) before it closes the listener, and the hub's supervisor fails in one line
saying so (supervisor/peers.py): a closed port is never silent.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from truestep.supervisor.link_auth import Channel, LinkAuthError, challenge_line, new_nonce, open_hello

MAX_PENDING = 32
MAX_PENDING_PER_SOURCE = 4
HELLO_DEADLINE_S = 5.0
HELLO_LIMIT = 4096
POLL_S = 0.2

Admit = Callable[[socket.socket, dict, Channel, bytes], None]
"""Called (in the gate's thread) with a connection whose hello proved the key, its hello, its channel and
what arrived after the hello; it owns the socket from then on."""


@dataclass
class _Pending:
    sock: socket.socket
    source: str
    nonce: str
    deadline: float
    buffer: bytearray = field(default_factory=bytearray)


class Gate:
    def __init__(self, listener: socket.socket, key: bytes, admit: Admit, stop: threading.Event) -> None:
        self.listener = listener
        self.key = key
        self.admit = admit
        self.stop = stop
        self.refused: Counter[str] = Counter()
        """Connections dropped before they proved the key, by reason (told in the supervisor's end event)."""
        self.pending: dict[int, _Pending] = {}
        self.errors: deque[str] = deque(maxlen=8)
        """The latest errors that dropped a connection (`refused["error"]` counts them all)."""
        self.failure: str | None = None
        """Why the loop ended other than by `stop` (set before the listener closes); None while it serves."""
        self._selector = selectors.DefaultSelector()
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)

    def serve(self) -> None:
        """Run until `stop` is set; then close what is still pending and the listener. Should the loop
        fail, `failure` says why before the listener closes."""
        try:
            while not self.stop.is_set():
                self.step(POLL_S)
        except BaseException as err:  # noqa: BLE001 - not swallowed: the hub's supervisor fails on `failure`
            self.failure = f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
        finally:
            for pending in list(self.pending.values()):
                self._drop(pending, "closed_at_end")
            self._selector.close()
            self.listener.close()

    def step(self, timeout: float) -> None:
        """One pass of the loop: wait up to `timeout` for connections and bytes, handle them, drop the
        connections past their deadline."""
        for key, _ in self._selector.select(timeout):
            if key.fileobj is self.listener:
                try:
                    self._accept()
                except Exception as err:  # noqa: BLE001 - a connection that breaks as it arrives is dropped
                    self._error(err)
                continue
            pending = key.data
            if self.pending.get(key.fd) is not pending:
                continue  # dropped earlier in this batch (evicted by a newer connection): nothing to read
            try:
                self._read(pending)
            except Exception as err:  # noqa: BLE001 - one connection's trouble is that connection's end
                self._error(err)
                if self.pending.get(key.fd) is pending:
                    self._release(pending)
                with contextlib.suppress(OSError):
                    pending.sock.close()
        now = time.monotonic()
        for pending in [p for p in self.pending.values() if p.deadline < now]:
            self._drop(pending, "too_slow")

    def _error(self, err: Exception) -> None:
        self.refused["error"] += 1
        self.errors.append(f"{type(err).__name__}: {' '.join(str(err).split())[:200]}")

    def _accept(self) -> None:
        try:
            sock, address = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # EMFILE and the like: the connection stays in the backlog, try again later
            self.refused["accept_failed"] += 1
            time.sleep(POLL_S)
            return
        try:
            self._challenge(sock, str(address[0]))
        except BaseException:
            sock.close()
            raise

    def _challenge(self, sock: socket.socket, source: str) -> None:
        """Make room for a new connection from `source` (evicting the oldest waiting one over a limit),
        send it a fresh challenge and wait for its hello."""
        same = [p for p in self.pending.values() if p.source == source]
        if len(same) >= MAX_PENDING_PER_SOURCE:
            self._drop(min(same, key=lambda p: p.deadline), "evicted")
        elif len(self.pending) >= MAX_PENDING:
            self._drop(min(self.pending.values(), key=lambda p: p.deadline), "evicted")
        sock.setblocking(False)
        pending = _Pending(sock, source, new_nonce(), time.monotonic() + HELLO_DEADLINE_S)
        try:
            sock.send(challenge_line(pending.nonce))  # ~70 bytes into an empty send buffer
        except OSError:
            self.refused["closed"] += 1
            sock.close()
            return
        self._selector.register(sock, selectors.EVENT_READ, pending)
        self.pending[sock.fileno()] = pending

    def _read(self, pending: _Pending) -> None:
        try:
            chunk = pending.sock.recv(HELLO_LIMIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(pending, "closed")
            return
        pending.buffer += chunk
        end = pending.buffer.find(b"\n")
        if end < 0:
            if len(pending.buffer) > HELLO_LIMIT:
                self._drop(pending, "too_long")
            return
        try:
            hello = open_hello(self.key, pending.nonce, bytes(pending.buffer[:end]))
        except LinkAuthError:
            self._drop(pending, "not_authenticated")
            return
        self._release(pending)
        channel = Channel(self.key, pending.nonce, hello["nonce"], is_hub=True)
        self.admit(pending.sock, hello, channel, bytes(pending.buffer[end + 1 :]))

    def _release(self, pending: _Pending) -> None:
        del self.pending[pending.sock.fileno()]
        self._selector.unregister(pending.sock)

    def _drop(self, pending: _Pending, reason: str) -> None:
        self.refused[reason] += 1
        self._release(pending)
        with contextlib.suppress(OSError):
            pending.sock.close()
