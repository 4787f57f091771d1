"""One authenticated connection of the supervisors' link (supervisor/peers.py): sealed lines, bounded
reads, sends that never block a supervisor for long."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

from truestep.supervisor.link_auth import Channel, LinkAuthError

IO_TIMEOUT_S = 1.0
"""Socket operations never block a supervisor longer than this (a partitioned peer does not answer)."""
MAX_LINE = 65536


class Conn:
    """One authenticated peer connection: sealed lines (supervisor/link_auth.py), the time of the last
    message, thread-safe sends."""

    def __init__(self, sock: socket.socket, channel: Channel, buffer: bytes = b"") -> None:
        sock.setblocking(True)
        sock.settimeout(IO_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.channel = channel
        self.buffer = buffer
        self.send_lock = threading.Lock()
        self.last_seen = time.monotonic()
        self.closed = False

    def send(self, message: dict[str, Any]) -> bool:
        with self.send_lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(self.channel.seal(message))
                return True
            except OSError:  # timeout (a partitioned peer's window is full) or reset: judged by silence/EOF
                return False

    def receive(self, deadline: float | None = None) -> dict[str, Any] | None:
        """The next message; None when the connection ended (EOF, reset) or, with a (monotonic)
        `deadline`, when none came by then. LinkAuthError when it is not authenticated or not JSON."""
        line, self.buffer = read_line(self.sock, self.buffer, MAX_LINE, deadline)
        if line is None:
            return None
        message = self.channel.open(line)
        self.last_seen = time.monotonic()
        return message

    def close(self) -> None:
        with self.send_lock:
            self.closed = True
        with contextlib.suppress(OSError):  # ENOTCONN: the peer is already gone, which is fine here
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def read_line(
    sock: socket.socket, buffer: bytes, limit: int, deadline: float | None
) -> tuple[bytes | None, bytes]:
    """(the next line without its end, what follows it); (None, buffer) at EOF, on a reset or past the
    (monotonic) deadline. LinkAuthError when more than `limit` bytes come without a line end."""
    while b"\n" not in buffer:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            if deadline is not None and time.monotonic() > deadline:
                return None, buffer
            continue
        except OSError:
            return None, buffer
        if not chunk:
            return None, buffer
        buffer += chunk
        if len(buffer) > limit:
            raise LinkAuthError(f"a line longer than {limit} bytes")
    line, rest = buffer.split(b"\n", 1)
    return line, rest
