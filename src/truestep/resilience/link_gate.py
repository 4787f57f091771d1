"""Node 0's front door on the node link: what a connection gets before it has proven the launch's key.

One thread and non-blocking sockets, so strangers cost neither threads nor unbounded descriptors:
- at most MAX_PENDING connections wait for their hello at once, MAX_PENDING_PER_SOURCE from one address;
  a new one over either limit evicts the oldest waiting one (of its address, else of all): holding the
  slots then takes a flood faster than a real node's handshake (one round trip), not a trickle of
  connections that just sit there;
- each gets a fresh challenge and HELLO_DEADLINE_S for its whole hello, however it trickles in (a slow
  sender is dropped at the deadline), and at most HELLO_LIMIT bytes without a line end;
- its hello's MAC is checked before a byte of it is parsed (resilience/link_auth.py); a hello that does
  not prove the key is dropped without an answer. Only a proven hello reaches `admit`, which decides
  (and answers, sealed) whether this node may join.
Nothing an unauthenticated connection sends can change the job: it is counted (`refused`) and dropped.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from truestep.resilience.link_auth import Channel, LinkAuthError, challenge_line, new_nonce, open_hello

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
        self._selector = selectors.DefaultSelector()
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)

    def serve(self) -> None:
        """Run until `stop` is set; then close what is still pending and the listener."""
        try:
            while not self.stop.is_set():
                for key, _ in self._selector.select(POLL_S):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        self._read(self.pending[key.fd])
                now = time.monotonic()
                for pending in [p for p in self.pending.values() if p.deadline < now]:
                    self._drop(pending, "too_slow")
        finally:
            for pending in list(self.pending.values()):
                self._drop(pending, "closed_at_end")
            self._selector.close()
            self.listener.close()

    def _accept(self) -> None:
        try:
            sock, address = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # EMFILE and the like: the connection stays in the backlog, try again later
            self.refused["accept_failed"] += 1
            time.sleep(POLL_S)
            return
        source = str(address[0])
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
        self.pending[sock.fileno()] = pending
        self._selector.register(sock, selectors.EVENT_READ)

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
