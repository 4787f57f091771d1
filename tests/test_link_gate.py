"""Node 0's front door on the node link survives anything one connection does (supervisor/link_gate.py),
driven one pass at a time over real localhost sockets: a connection evicted by a newer one in the very
`select()` batch in which it is readable (the race a connection flood hit: a KeyError that killed the
gate's thread and closed the port), and a connection whose handling fails. A gate whose loop stops
anyway is not a silently closed port: the hub's supervisor fails in one line (exit 1)."""

from __future__ import annotations

import selectors
import socket
import threading
import time
from typing import Any

import pytest

from truestep.core.errors import ExitCode, expected_failure
from truestep.supervisor.link_auth import hello_line, new_key, read_challenge
from truestep.supervisor.link_gate import MAX_PENDING_PER_SOURCE, Gate
from truestep.supervisor.peers import GateFailedError, Hub

KEY = new_key()
STRANGER = "127.0.0.2"


def _gate(admit: Any = None) -> tuple[Gate, list[tuple[socket.socket, dict]]]:
    admitted: list[tuple[socket.socket, dict]] = []

    def keep(sock: socket.socket, hello: dict, channel: object, rest: bytes) -> None:
        admitted.append((sock, hello))

    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    return Gate(listener, KEY, admit or keep, threading.Event()), admitted


def _connect(gate: Gate, source: str = STRANGER) -> socket.socket:
    return socket.create_connection(gate.listener.getsockname(), timeout=5.0, source_address=(source, 0))


def _challenge(sock: socket.socket) -> str:
    line = b""
    while not line.endswith(b"\n"):
        line += sock.recv(4096)
    return read_challenge(line.strip())


def _steps_until(gate: Gate, done: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"the gate never got there: {dict(gate.refused)}"
        gate.step(0.05)


def _listener_first(gate: Gate) -> None:
    """The gate's selector hands over the listener's event before the connections' (epoll's order is the
    order of readiness; this makes the race the same on every run)."""
    select = gate._selector.select

    def ordered(timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = select(timeout)
        return sorted(events, key=lambda event: event[0].fileobj is not gate.listener)

    gate._selector.select = ordered  # type: ignore[method-assign]


def test_a_connection_evicted_in_the_batch_that_reads_it_is_skipped() -> None:
    gate, admitted = _gate()
    try:
        crowd = []
        for _ in range(MAX_PENDING_PER_SOURCE):  # one address's whole share of waiting connections
            crowd.append(_connect(gate))
            waiting = len(crowd)
            _steps_until(gate, lambda waiting=waiting: len(gate.pending) == waiting)
            _challenge(crowd[-1])
        newcomer = _connect(gate)  # the listener is readable: accepting it evicts the oldest ...
        for sock in crowd:
            sock.sendall(b"{")  # ... which is readable in the same batch
        time.sleep(0.2)
        _listener_first(gate)
        gate.step(1.0)
        assert gate.refused["evicted"] == 1 and gate.refused["error"] == 0, dict(gate.refused)
        assert len(gate.pending) == MAX_PENDING_PER_SOURCE
        # and the gate still serves: a hello that proves the key is admitted
        real = _connect(gate, "127.0.0.1")
        _steps_until(gate, lambda: any(p.source == "127.0.0.1" for p in gate.pending.values()))
        real.sendall(hello_line(KEY, _challenge(real), {"type": "hello", "node": 1, "nonce": "ab" * 16}))
        _steps_until(gate, lambda: admitted)
        assert admitted[0][1]["node"] == 1
        for sock in (*crowd, newcomer, real):
            sock.close()
    finally:
        gate.stop.set()
        gate.listener.close()


def test_a_connection_whose_handling_fails_is_dropped_and_the_gate_serves_on() -> None:
    calls = []

    def admit(sock: socket.socket, hello: dict, channel: object, rest: bytes) -> None:
        calls.append(hello)
        if len(calls) == 1:
            raise RuntimeError("a bug in the first admission")
        sock.close()

    gate, _ = _gate(admit)
    try:
        for _ in range(2):
            sock = _connect(gate, "127.0.0.1")
            _steps_until(gate, lambda: len(gate.pending) == 1)
            sock.sendall(hello_line(KEY, _challenge(sock), {"type": "hello", "nonce": "cd" * 16}))
            count = len(calls)
            _steps_until(gate, lambda count=count: len(calls) > count)
            sock.settimeout(5.0)
            assert sock.recv(10) == b"", "the connection whose handling failed was not closed"
            sock.close()
        assert len(calls) == 2 and gate.refused["error"] == 1, dict(gate.refused)
        assert list(gate.errors) == ["RuntimeError: a bug in the first admission"]
        assert gate.failure is None
    finally:
        gate.stop.set()
        gate.listener.close()


def test_a_gate_that_stops_fails_the_hubs_supervisor_in_one_line() -> None:
    hub = Hub(2, "job", "0", 0.05, 0.5, join_timeout_s=30.0, key=KEY)
    try:
        assert hub.check() is None

        def broken(timeout: float | None = None) -> list:
            raise OSError(9, "Bad file descriptor")

        hub.gate._selector.select = broken  # type: ignore[method-assign]
        deadline = time.monotonic() + 5.0
        while hub.gate.failure is None:
            assert time.monotonic() < deadline, "the gate's loop did not stop"
            time.sleep(0.02)
        with pytest.raises(GateFailedError) as caught:
            hub.check()
        code, line = expected_failure(caught.value) or (None, "")
        assert code == ExitCode.FAILURE and "\n" not in line
        assert "node link gate stopped (OSError: [Errno 9] Bad file descriptor)" in line, line
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", hub.port), timeout=2.0).close()  # the port is closed
    finally:
        hub.close(0, "completed")
