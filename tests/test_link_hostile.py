"""Strangers on a real job's node link (supervisor/link_auth.py, link_gate.py): two supervisors as two
"nodes" share a run directory; before node 1 starts, everything public about the job is known to an
attacker (the lease names the job, the launch and node 0's link port) and it tries: a hello as node 1
without the key, a hello recorded on another connection, garbage, a 100 MB line, deeply nested JSON, a
forged goodbye with code 3 and a forged loss record of a node 7 -- and, while the real node 1 joins,
1,100 slow connections held plus a connection flood from one more address (node 0 evicts waiting
connections in the very batch in which they are readable: the race that once killed its gate and closed
the port within a second, so node 1 never joined and both nodes exited 77). Node 0 runs with the usual 1,024-descriptor limit. The job must train on, the
real node must join, and the run must end bitwise equal to the failure-free reference with no failure
detected; node 0's supervisor_end counts what it refused."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import events, truestep_env
from supervised import assert_matches_reference, finish, launch_cmd, supervisor_events
from truestep.supervisor.link_auth import hello_line, read_challenge, read_key

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

JOB = "hostile-link"
STRANGERS = 1100


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def _hub_port(run: Path, timeout: float = 120) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            port = json.loads((run / "lease.json").read_text()).get("hub_port", 0)
        except (OSError, ValueError):
            port = 0
        if port:
            return int(port)
        time.sleep(0.1)
    raise AssertionError("node 0 never published its link port in the lease")


def _key(run: Path, timeout: float = 60) -> bytes:
    deadline = time.time() + timeout
    while (key := read_key(run, JOB, "0")) is None:
        assert time.time() < deadline, "node 0 never published its link key"
        time.sleep(0.1)
    return key


def _stranger(port: int) -> tuple[socket.socket, str]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5.0, source_address=("127.0.0.2", 0))
    line = b""
    while not line.endswith(b"\n"):
        line += sock.recv(4096)
    return sock, read_challenge(line.strip())


def _send_and_expect_silence(port: int, payload: bytes) -> None:
    sock, _ = _stranger(port)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(payload)
    sock.settimeout(10.0)
    with contextlib.suppress(ConnectionResetError):
        assert sock.recv(4096) == b"", "node 0 answered a stranger"
    sock.close()


def _hello(node: int = 1) -> dict:
    return {"type": "hello", "node": node, "nnodes": 2, "job": JOB, "generation": "0", "host": "intruder",
            "nonce": "ab" * 16}  # fmt: skip


def test_strangers_on_the_link_change_nothing(supervised_reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    cmd = [*launch_cmd(run, nproc=1), "--nnodes=2", f"--master-port={_free_port()}", f"--job-id={JOB}"]
    # node 1 starts only after the attacks; once, on a loaded CI machine, its admission past the flood
    # took over 120 s (15 s here): the bound is for a hang, not a speed claim
    cmd.append("--resilience.startup_timeout_s=240")
    env = truestep_env({"TRUESTEP_JOB_GENERATION": "0"})
    node0 = subprocess.Popen(
        [*cmd, "--node-rank=0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_limit_fds,
    )  # fmt: skip
    crowd = node1 = None
    try:
        port = _hub_port(run)
        # Everything public, or seen on the wire -- but never the key.
        _send_and_expect_silence(port, json.dumps(_hello()).encode() + b"\n")  # the old hello
        sock, challenge = _stranger(port)
        recorded = hello_line(_key(run), challenge, _hello())  # what the real node sends, on the wire
        sock.close()
        _send_and_expect_silence(port, recorded)  # replayed on another connection
        _send_and_expect_silence(port, b"\x00\xffgarbage\n")
        _send_and_expect_silence(port, b"[" * 100_000 + b"\n")
        _send_and_expect_silence(port, b"x" * (100 << 20))  # a 100 MB line
        _send_and_expect_silence(port, b'{"type": "bye", "code": 3, "outcome": "refused"}\n')
        lost = {"node": 7, "host": "x", "how": "closed", "detail": "forged", "code": None}
        _send_and_expect_silence(port, json.dumps({"type": "bye", "code": 0, "lost": lost}).encode() + b"\n")
        crowd = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("link_strangers.py")), str(port), str(STRANGERS), "25", "flood"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert crowd.stdout is not None and crowd.stdout.readline().startswith("holding")
        node1 = subprocess.Popen(
            [*cmd, "--node-rank=1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert finish(node1) == 0, finish.last_output  # type: ignore[attr-defined]
        assert finish(node0) == 0, finish.last_output  # type: ignore[attr-defined]
    finally:
        for proc in (crowd, node1, node0):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    failures = supervisor_events(run, "failure_detected")
    assert failures == [] and supervisor_events(run, "restart") == [], failures
    assert [e["attempt"] for e in supervisor_events(run, "attempt_start")] == [0, 0]
    [joined] = supervisor_events(run, "node_joined")
    assert joined["node"] == 1
    ends = {e["node"]: e for e in supervisor_events(run, "supervisor_end")}
    refused = ends[0]["link_refused"]
    assert refused.get("not_authenticated", 0) >= 5 and refused.get("too_long", 0) >= 1, refused
    assert refused.get("evicted", 0) + refused.get("too_slow", 0) >= STRANGERS - 40, refused
    assert [e for e in events(run) if e.get("event") == "fault_injected"] == []
    assert_matches_reference(run, supervised_reference)
    assert not (run / "node-link.key").exists(), "node 0 left its launch's secret behind"
