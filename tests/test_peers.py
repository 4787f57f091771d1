"""The supervisors' own link between the nodes of a job (supervisor/peers.py), over real localhost TCP:
a node that ends says goodbye with its exit code, one whose supervisor dies is noticed at once, one that
goes silent is noticed after node_timeout_s, strangers and duplicates are refused, and a restart in
place waits for a beat from every node after the failure."""

from __future__ import annotations

import time

import pytest

from truestep.core.errors import ExitCode, NodeLostError, UsageError
from truestep.supervisor.link_auth import new_key
from truestep.supervisor.peers import Hub, Member

INTERVAL, TIMEOUT = 0.05, 0.5
KEY = new_key()


def hub(nnodes: int = 2, join_timeout: float = 5.0, generation: str = "0") -> Hub:
    return Hub(nnodes, "job", generation, INTERVAL, TIMEOUT, join_timeout, key=KEY)


def member(
    h: Hub, node: int = 1, nnodes: int = 2, generation: str = "0", job: str = "job", key: bytes = KEY
) -> Member:
    m = Member(node, nnodes, job, generation, INTERVAL, TIMEOUT)
    m.join("127.0.0.1", h.port, timeout_s=5.0, key=lambda: key)
    return m


def until(check, timeout: float = 3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"not within {timeout} s")


@pytest.mark.slow  # over ~1.5 s here: the whole suite, not the fast tier
def test_beats_keep_both_sides_alive_and_a_clean_goodbye_is_not_a_loss() -> None:
    h = hub()
    m = member(h)
    time.sleep(3 * TIMEOUT)  # many timeouts long: beats keep both sides alive
    assert h.check() is None and m.check() is None
    assert h.require_all(since=time.monotonic()) is None  # a fresh beat arrives within an interval
    m.close(ExitCode.REQUEUE, "requeue")  # preempted: its peers end the same way
    until(lambda: h.peers[1].gone is not None)
    assert h.check() is None
    loss = h.require_all(since=time.monotonic())  # but a restart in place cannot happen without it
    assert loss is not None and (loss.how, loss.code) == ("left", ExitCode.REQUEUE)
    assert loss.exit_code() == ExitCode.REQUEUE  # it was preempted: so is this node, not "lost"
    h.close(0, "completed")


def test_a_node_waiting_for_node_0_follows_its_preemption() -> None:
    h = hub()
    m = member(h)
    h.close(ExitCode.REQUEUE, "requeue")
    until(lambda: m.peers[0].gone is not None)
    with pytest.raises(NodeLostError) as caught:
        m.raise_if_gone()
    assert caught.value.exit_code == ExitCode.REQUEUE


def test_a_dead_supervisor_is_noticed_at_once() -> None:
    h = hub()
    m = member(h)
    m.stop.set()
    m.peers[0].conn.sock.close()  # what the kernel does for a SIGKILLed process: no goodbye
    started = time.monotonic()
    loss = until(h.check)
    assert time.monotonic() - started < TIMEOUT, "judged by silence, not by the closed connection"
    assert (loss.node, loss.how, loss.exit_code()) == (1, "closed", ExitCode.NODE_LOST)
    h.close(ExitCode.NODE_LOST, "node_lost", loss)


def test_a_silent_node_is_lost_after_node_timeout_on_both_sides() -> None:
    h = hub()
    m = member(h)
    h.stop.set()  # both stop beating, connections stay open: a partition
    m.stop.set()
    started = time.monotonic()
    seen_by_hub, seen_by_member = until(h.check), until(m.check)
    elapsed = time.monotonic() - started
    assert (seen_by_hub.node, seen_by_hub.how) == (1, "silent")
    assert (seen_by_member.node, seen_by_member.how) == (0, "silent")
    assert TIMEOUT - 2 * INTERVAL <= elapsed < TIMEOUT + 1.0, elapsed


def test_a_refusal_ends_the_job_with_that_code_and_the_lost_node_is_passed_on() -> None:
    h = hub(nnodes=3)
    one, two = member(h, 1, 3), member(h, 2, 3)
    two.close(ExitCode.REFUSED, "refused")  # a refused checkpoint on node 2: no requeue can fix it
    loss = until(h.check)
    assert (loss.node, loss.how, loss.code, loss.exit_code()) == (2, "left", 3, ExitCode.REFUSED)
    h.close(loss.exit_code(), "refused", loss)
    told = until(one.check)
    assert (told.node, told.via, told.exit_code()) == (2, 0, ExitCode.REFUSED), told
    assert "ended (refused)" in told.detail
    with pytest.raises(NodeLostError, match="node 2"):
        one.raise_if_gone()


def test_strangers_and_duplicates_are_refused() -> None:
    h = hub(nnodes=3)
    member(h, 1, 3)
    with pytest.raises(UsageError, match="already joined"):
        member(h, 1, 3)
    with pytest.raises(UsageError, match="launch 7"):
        member(h, 2, 3, generation="7")
    with pytest.raises(UsageError, match="--nnodes 4"):
        member(h, 2, 4)
    with pytest.raises(UsageError, match="not in 1..2"):
        member(h, 5, 3)
    assert h.check() is None  # refused strangers are not members


def test_a_node_that_never_joins_or_cannot_reach_node_0_is_lost() -> None:
    h = hub(join_timeout=0.3)
    loss = until(h.check)
    assert (loss.node, loss.how) == (1, "never_joined")
    port = h.port
    h.close(ExitCode.NODE_LOST, "node_lost", loss)
    with pytest.raises(NodeLostError, match="cannot be reached"):
        Member(1, 2, "job", "0", INTERVAL, TIMEOUT).join("127.0.0.1", port, timeout_s=0.5, key=lambda: KEY)
