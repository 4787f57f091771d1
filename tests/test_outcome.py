"""One classification of how a process ended (core/errors.py: `Outcome`), and everyone who uses it agreeing.

A table over every exit code truestep has, a custom requeue code, signals and codes nobody gave a
meaning; then the peer link, the node-loss rule, the supervisor's codes and the scheduler's list read
from it. In-process, no processes started.
"""

from __future__ import annotations

import pytest

from truestep.core.errors import NO_REQUEUE, NOT_RETRYABLE, ExitCode, NodeLostError, Outcome
from truestep.supervisor.node_loss import NodeLoss
from truestep.supervisor.peers import PeerLink, _Peer

CUSTOM = 85
"""A custom `resilience.requeue_exit_code` (validated: neither it nor 86 is another truestep code)."""

OUT = Outcome
# code -> (outcome with the default requeue code 75, outcome with requeue code 85)
TABLE: dict[int, tuple[Outcome, Outcome]] = {
    0: (OUT.CLEAN, OUT.CLEAN),
    1: (OUT.FAILED, OUT.FAILED),
    2: (OUT.REFUSED, OUT.REFUSED),
    3: (OUT.REFUSED, OUT.REFUSED),
    4: (OUT.REFUSED, OUT.REFUSED),
    5: (OUT.FENCED, OUT.FENCED),
    6: (OUT.STORAGE, OUT.STORAGE),
    8: (OUT.FAILED, OUT.FAILED),  # the verdict's INCOMPLETE: a CLI's answer, never a rank's end
    75: (OUT.REQUEUE, OUT.FAILED),
    76: (OUT.REQUEUE, OUT.FAILED),
    77: (OUT.NODE_LOST, OUT.NODE_LOST),
    130: (OUT.INTERRUPTED, OUT.INTERRUPTED),
    85: (OUT.FAILED, OUT.REQUEUE),
    86: (OUT.FAILED, OUT.REQUEUE),
    -9: (OUT.FAILED, OUT.FAILED),  # SIGKILL, as subprocess reports it
    -15: (OUT.FAILED, OUT.FAILED),
    137: (OUT.FAILED, OUT.FAILED),  # a shell's 128 + SIGKILL
    255: (OUT.FAILED, OUT.FAILED),
}
# outcome -> (orderly, retryable, requeue)
PROPERTIES = {
    OUT.CLEAN: (True, True, False),
    OUT.REQUEUE: (True, True, True),
    OUT.INTERRUPTED: (True, True, False),
    OUT.FAILED: (False, True, True),
    OUT.NODE_LOST: (False, True, True),
    OUT.REFUSED: (False, False, False),
    OUT.FENCED: (False, False, False),
    OUT.STORAGE: (False, False, False),
}


def test_the_table_covers_every_exit_code_and_every_outcome() -> None:
    assert {int(c) for c in ExitCode} <= set(TABLE)
    assert {o for pair in TABLE.values() for o in pair} == set(Outcome) == set(PROPERTIES)


@pytest.mark.parametrize("code", sorted(TABLE))
def test_every_code_has_one_outcome_with_the_default_and_a_custom_requeue_code(code: int) -> None:
    default, custom = TABLE[code]
    assert Outcome.of(code) == default
    assert Outcome.of(code, ExitCode.REQUEUE) == default
    assert Outcome.of(code, CUSTOM) == custom


@pytest.mark.parametrize("outcome", list(Outcome))
def test_what_each_outcome_means(outcome: Outcome) -> None:
    assert (outcome.orderly, outcome.retryable, outcome.requeue) == PROPERTIES[outcome]


def test_the_supervisors_stops_and_the_schedulers_list_are_read_from_the_table() -> None:
    assert {int(c) for c in NOT_RETRYABLE} == {2, 3, 4, 5, 6}
    assert [int(c) for c in NO_REQUEUE] == [2, 3, 4, 5, 6, 130]  # train.sbatch's default (a test checks)


# ---------------------------------------------------------------------------------------------- node loss


@pytest.mark.parametrize("code", sorted(TABLE))
def test_what_survivors_exit_with_when_a_node_left_with_each_code(code: int) -> None:
    """A node that left with a code saying what to do is followed (a refusal, a fence, a full disk, an
    interrupt, a preemption with the job's requeue code); anything else is a loss: 77, requeue me."""
    left = NodeLoss(1, "host", "left", f"ended with {code}", code=code)
    for requeue_code, outcome in zip((ExitCode.REQUEUE, CUSTOM), TABLE[code], strict=True):
        follow = outcome in (OUT.REFUSED, OUT.FENCED, OUT.STORAGE, OUT.INTERRUPTED, OUT.REQUEUE)
        assert left.exit_code(requeue_code) == (code if follow else ExitCode.NODE_LOST), (code, requeue_code)


def test_a_full_disk_on_one_node_is_not_requeued_as_a_node_loss() -> None:
    """The copy in NodeLoss left out exit 6: a full disk on node 1 made node 0 exit 77 and the
    scheduler requeue the job into the same full disk."""
    assert NodeLoss(1, "h", "left", "disk full", code=ExitCode.STORAGE).exit_code() == ExitCode.STORAGE
    assert ExitCode.NODE_LOST not in NO_REQUEUE and ExitCode.STORAGE in NO_REQUEUE


def test_a_node_gone_without_a_code_is_lost() -> None:
    for how in ("closed", "silent", "never_joined"):
        assert NodeLoss(1, "h", how, "gone").exit_code(CUSTOM) == ExitCode.NODE_LOST


def _link(requeue_code: int, code: int) -> PeerLink:
    link = PeerLink(0, 2, "job", "0", interval_s=1.0, timeout_s=5.0, requeue_code=requeue_code)
    link.peers = {1: _Peer(1, "host", joined=True, gone=NodeLoss(1, "host", "left", "bye", code=code))}
    return link


@pytest.mark.parametrize("code", sorted(TABLE))
def test_the_peer_link_judges_a_goodbye_by_the_jobs_requeue_code(code: int) -> None:
    """The copy in peers.py hard-coded 75/76 as clean: with a custom requeue code a preempted node's
    goodbye (85) read as a loss, and the survivors exited 77 instead of following the preemption."""
    for requeue_code, outcome in zip((ExitCode.REQUEUE, CUSTOM), TABLE[code], strict=True):
        loss = _link(requeue_code, code).check()
        assert (loss is None) == outcome.orderly, (code, requeue_code, loss)


def test_a_member_waiting_for_node_0_follows_its_custom_requeue() -> None:
    followed = _link(CUSTOM, CUSTOM)  # node 0 left with the job's requeue code: preempted
    with pytest.raises(NodeLostError) as left:
        followed.raise_if_gone()
    assert left.value.exit_code == CUSTOM  # not an ExitCode: ExitCode(85) raised ValueError here
    lost = _link(CUSTOM, 0)
    lost.peers[1].gone = NodeLoss(1, "host", "closed", "no goodbye")
    with pytest.raises(NodeLostError) as closed:
        lost.raise_if_gone()
    assert closed.value.exit_code == ExitCode.NODE_LOST
