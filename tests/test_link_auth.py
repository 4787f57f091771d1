"""The node link is the job's own (supervisor/link_auth.py, link_gate.py, link_messages.py), over real
localhost TCP: a hello that does not prove this launch's secret -- forged, replayed from another
connection, garbage, a 100 MB line, deeply nested JSON, a trickle -- is dropped without an answer and
never joins; 1,100 slow connections cannot exhaust node 0 or keep the real node out; a forged goodbye or
loss record changes nothing; an authenticated message with a field out of range is a protocol error;
the key file is a secret (0600, this user's) or is refused. The same against real supervisors:
tests/test_link_hostile.py."""

from __future__ import annotations

import json
import os
import resource
import socket
import threading
import time
from pathlib import Path

import pytest

from truestep.core.errors import ExitCode, RefusedError
from truestep.supervisor import link_gate
from truestep.supervisor.link_auth import (
    Channel,
    LinkAuthError,
    hello_line,
    key_path,
    new_key,
    read_challenge,
    read_key,
    remove_key,
    write_key,
)
from truestep.supervisor.link_messages import LinkProtocolError, check_bye
from truestep.supervisor.peers import Hub, Member

INTERVAL, TIMEOUT = 0.05, 0.5
KEY = new_key()
STRANGER = "127.0.0.2"
"""Attackers connect from here (any 127/8 address is this machine), the real member from 127.0.0.1."""


def hub(nnodes: int = 2) -> Hub:
    return Hub(nnodes, "job", "0", INTERVAL, TIMEOUT, join_timeout_s=30.0, key=KEY)


def join(h: Hub, node: int = 1, nnodes: int = 2, key: bytes = KEY, timeout: float = 10.0) -> Member:
    m = Member(node, nnodes, "job", "0", INTERVAL, TIMEOUT)
    m.join("127.0.0.1", h.port, timeout_s=timeout, key=lambda: key)
    return m


def connect(h: Hub, source: str = STRANGER) -> tuple[socket.socket, str]:
    """A stranger's connection and the challenge node 0 sent it."""
    sock = socket.create_connection(("127.0.0.1", h.port), timeout=5.0, source_address=(source, 0))
    line = b""
    while not line.endswith(b"\n"):
        line += sock.recv(4096)
    return sock, read_challenge(line.strip())


def dropped(sock: socket.socket, timeout: float = 5.0) -> bool:
    """Node 0 closed the connection without a word."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(4096)
    except ConnectionResetError:
        data = b""
    sock.close()
    return data == b""


def hello(node: int = 1, nnodes: int = 2, **changes: object) -> dict:
    return {"type": "hello", "node": node, "nnodes": nnodes, "job": "job", "generation": "0", "host": "h",
            "nonce": "0" * 32, **changes}  # fmt: skip


def nobody_joined(h: Hub) -> bool:
    return not any(p.joined for p in h.peers.values()) and h.check() is None


def test_a_forged_hello_is_dropped_and_the_real_node_still_joins() -> None:
    h = hub()
    sock, challenge = connect(h)
    sock.sendall(hello_line(new_key(), challenge, hello()))  # everything public, but not the key
    assert dropped(sock)
    sock, _ = connect(h)
    sock.sendall(json.dumps(hello()).encode() + b"\n")  # the old, unauthenticated hello
    assert dropped(sock)
    assert nobody_joined(h) and h.refused["not_authenticated"] == 2
    m = join(h)
    assert h.peers[1].joined and h.check() is None and m.check() is None
    h.close(0, "completed")


def test_a_replayed_hello_is_worthless_on_another_connection() -> None:
    h = hub()
    sock, challenge = connect(h)
    recorded = hello_line(KEY, challenge, hello())  # what the real node sent, seen on the wire
    sock.close()
    replay, _ = connect(h)
    replay.sendall(recorded)
    assert dropped(replay)
    assert nobody_joined(h) and h.refused["not_authenticated"] == 1
    join(h)
    h.close(0, "completed")


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00\xff garbage \x80\n",
        b"GET / HTTP/1.0\r\n\r\n",
        b"[" * 100_000 + b"\n",  # deeply nested JSON: never reaches the parser
        b"a" * 64 + b" " + b"[" * 3000 + b"\n",  # MAC-shaped, nested body
    ],
    ids=["binary", "http", "deep-json", "mac-shaped-deep-json"],
)
def test_garbage_and_deep_json_are_dropped(payload: bytes, capfd: pytest.CaptureFixture[str]) -> None:
    h = hub()
    sock, _ = connect(h)
    sock.sendall(payload)
    assert dropped(sock)
    assert nobody_joined(h) and sum(h.refused.values()) == 1
    assert "Traceback" not in capfd.readouterr().err
    join(h)
    h.close(0, "completed")


def test_a_100_mb_line_is_cut_off_at_the_hello_limit() -> None:
    h = hub()
    sock, _ = connect(h)
    chunk, sent = b"x" * (1 << 20), 0
    sock.settimeout(10.0)
    try:
        while sent < 100 << 20:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    sock.close()
    assert sent < 100 << 20, "node 0 read all 100 MB"
    time.sleep(0.3)
    assert h.refused["too_long"] == 1 and nobody_joined(h)
    join(h)
    h.close(0, "completed")


def test_a_trickle_is_dropped_at_the_hello_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link_gate, "HELLO_DEADLINE_S", 1.0)
    h = hub()
    sock, _ = connect(h)
    started = time.monotonic()
    try:
        while time.monotonic() - started < 5.0:
            sock.sendall(b"{")  # a byte every 0.1 s: never a complete hello
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert time.monotonic() - started < 3.0, "the slow sender was not dropped at the deadline"
    assert h.refused["too_slow"] == 1
    h.close(0, "completed")


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_1100_slow_connections_neither_exhaust_node_0_nor_keep_the_real_node_out() -> None:
    """Each stranger sends a byte every half second and never a hello. Node 0 holds at most
    MAX_PENDING of them at once (MAX_PENDING_PER_SOURCE per address), evicting the oldest, so its
    descriptors stay bounded; the real node, from its own address, joins while they keep coming."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2400:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard}: 1,100 connections need 2 descriptors each here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2400), hard))
    h = hub()
    fds_before = len(os.listdir("/proc/self/fd"))
    strangers: list[socket.socket] = []
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.5):
            for sock in list(strangers):
                try:
                    sock.send(b"{")
                except OSError:
                    strangers.remove(sock)

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        for i in range(1100):
            source = f"127.0.{1 + i % 4}.{2 + i % 200}"  # 800 addresses: both limits are hit
            strangers.append(
                socket.create_connection(("127.0.0.1", h.port), timeout=5.0, source_address=(source, 0))
            )
        time.sleep(1.0)
        held = len(os.listdir("/proc/self/fd")) - fds_before - len(strangers)
        # Stated here, not read from the gate: a gate without its bounds must fail this.
        assert len(h.gate.pending) <= 32
        assert held <= 40, f"node 0 holds {held} descriptors for strangers"
        m = join(h, timeout=30.0)  # from 127.0.0.1 while they keep trickling
        assert h.peers[1].joined and m.check() is None
    finally:
        stop.set()
        sender.join()
        for sock in strangers:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert h.refused.get("evicted", 0) >= 1100 - 32
    assert h.check() is None
    h.close(0, "completed")


def test_a_forged_goodbye_and_loss_record_change_nothing() -> None:
    h = hub(nnodes=3)
    one = join(h, 1, 3)
    for message in (
        {"type": "bye", "code": 3, "outcome": "refused"},
        {"type": "bye", "code": 0, "outcome": "done", "lost": {"node": 7, "how": "closed", "detail": "x"}},
    ):
        sock, _ = connect(h)
        sock.sendall(json.dumps(message).encode() + b"\n")
        assert dropped(sock)
    # Also spliced into the real node's stream without its key: a protocol error would be a loss, so the
    # forgery must not even reach it -- it never can, the stranger has its own connection.
    assert h.check() is None and one.check() is None and not h.peers[2].joined
    join(h, 2, 3)
    assert h.check() is None
    h.close(0, "completed")


def test_sealed_messages_cannot_be_replayed_reordered_or_reflected() -> None:
    hub_side = Channel(KEY, "a" * 32, "b" * 32, is_hub=True)
    member_side = Channel(KEY, "a" * 32, "b" * 32, is_hub=False)
    other = Channel(KEY, "c" * 32, "b" * 32, is_hub=False)
    first, second = hub_side.seal({"type": "beat", "node": 0}), hub_side.seal({"type": "bye", "code": 0})
    with pytest.raises(LinkAuthError):
        member_side.open(second.strip())  # out of order
    assert member_side.open(first.strip())["type"] == "beat"
    with pytest.raises(LinkAuthError):
        member_side.open(first.strip())  # replayed
    with pytest.raises(LinkAuthError):
        other.open(second.strip())  # another connection's
    with pytest.raises(LinkAuthError):
        hub_side.open(
            member_side.seal({"type": "beat", "node": 1}).replace(b'"node": 1', b'"node": 2').strip()
        )
    reflected = hub_side.seal({"type": "beat", "node": 0})
    with pytest.raises(LinkAuthError):
        hub_side.open(reflected.strip())  # its own message sent back to it
    deep = member_side.seal({"x": 1}).split(b" ", 1)[0]  # a valid MAC on a different (deep) body fails too
    with pytest.raises(LinkAuthError):
        hub_side.open(deep + b" " + b"[" * 5000)


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ({"type": "bye", "code": 99, "outcome": "x"}, "exit code 99"),
        ({"type": "bye", "code": "3", "outcome": "x"}, "not an integer"),
        ({"type": "bye", "code": 0, "lost": {"node": 7, "how": "closed"}}, "node 7"),
        ({"type": "bye", "code": 0, "lost": {"node": 1, "how": "closed"}}, "node 1"),  # the sender itself
        ({"type": "bye", "code": 0, "lost": {"node": -1, "how": "closed"}}, "node -1"),
        ({"type": "bye", "code": 0, "lost": {"node": 2, "how": "eaten"}}, "how='eaten'"),
        ({"type": "bye", "code": 0, "lost": {"node": 2, "how": "left", "code": 1234}}, "exit code 1234"),
        ({"type": "bye", "code": 0, "lost": {"node": 2, "how": "left", "detail": "x" * 5000}}, "detail"),
    ],
)
def test_every_field_of_an_authenticated_goodbye_is_checked(message: dict, problem: str) -> None:
    with pytest.raises(LinkProtocolError, match=problem):
        check_bye(message, sender=1, receiver=0, nnodes=3, requeue_code=ExitCode.REQUEUE)


def test_an_authenticated_goodbye_out_of_range_is_a_protocol_error_not_an_exit_code() -> None:
    """Node 1 (with the key) says goodbye with a code no supervisor ends with: node 0 does not exit with
    it; the connection is a protocol error (the node is lost, 77)."""
    h = hub()
    m = join(h)
    with m.lock:
        conn = m.peers[0].conn
    assert conn is not None and conn.send({"type": "bye", "code": 42, "outcome": "refused"})
    deadline = time.monotonic() + 5
    while (loss := h.check()) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert loss is not None and (loss.how, loss.code) == ("closed", None) and "exit code 42" in loss.detail
    assert loss.exit_code() == ExitCode.NODE_LOST
    h.close(ExitCode.NODE_LOST, "node_lost", loss)


def test_a_member_with_another_launchs_key_cannot_join() -> None:
    h = hub()
    with pytest.raises(Exception, match="without proving the key"):
        join(h, key=new_key(), timeout=1.0)
    assert nobody_joined(h)
    h.close(0, "completed")


# ------------------------------------------------------------------------------------------ the key file


def test_the_key_file_is_a_secret_of_this_launch(tmp_path: Path) -> None:
    key = new_key()
    write_key(tmp_path, "job", "3", key)
    assert (key_path(tmp_path).stat().st_mode & 0o777) == 0o600
    assert read_key(tmp_path, "job", "3") == key
    assert read_key(tmp_path, "job", "2") is None  # the last launch's key: wait for this launch's
    assert read_key(tmp_path, "other", "3") is None
    remove_key(tmp_path, new_key())  # not ours: kept
    assert key_path(tmp_path).exists()
    remove_key(tmp_path, key)
    assert read_key(tmp_path, "job", "3") is None


@pytest.mark.parametrize("how", ["readable", "symlink", "garbage"])
def test_a_key_file_that_is_not_a_secret_is_refused(tmp_path: Path, how: str) -> None:
    write_key(tmp_path, "job", "0", new_key())
    path = key_path(tmp_path)
    if how == "readable":
        path.chmod(0o644)
    elif how == "symlink":
        path.rename(tmp_path / "elsewhere")
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.write_text("[" * 10_000)
        path.chmod(0o600)
    with pytest.raises(RefusedError, match="node link key"):
        read_key(tmp_path, "job", "0")
