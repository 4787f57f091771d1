"""Recovery from memory (resilience.snapshot_every_steps = 1) under the real supervisor, one fault class a
test: the failed rank is restored from its buddy's memory, the survivor from its own, at most one step is
lost, and the run ends bit for bit the failure-free run's, verified by its own self-check; where memory
cannot serve (the buddy lost too, a flipped byte) the disk restores it, said in one line.

The snapshots live in a tmp directory per test (resilience.snapshot_dir), not /dev/shm.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from harness import events
from supervised import (
    HOLD_OVERRIDE,
    HOLD_STEP,
    assert_matches_reference,
    finish,
    hold,
    supervise,
    supervisor_events,
    wait_until_held,
)

pytestmark = pytest.mark.multiprocess


def memory(tmp_path: Path) -> list[str]:
    return [
        "--resilience.snapshot_every_steps=1",
        f"--resilience.snapshot_dir={tmp_path / 'memory'}",
        "--resilience.startup_timeout_s=60",  # a loaded machine imports torch slowly
        HOLD_OVERRIDE,
    ]


@pytest.fixture
def reference(supervised_reference: Path) -> Path:
    return supervised_reference


def self_checks(run: Path) -> list[dict]:
    return [
        e for e in events(run) if e["event"] in ("resume_verified", "resume_unverified", "resume_diverged")
    ]


def copies_of(tmp_path: Path, holder: int, owner: int) -> list[Path]:
    return sorted((tmp_path / "memory").glob(f"*/*/rank{holder:05d}/c{owner:05d}.*.bin"))


def complete_copies(tmp_path: Path, holder: int, owner: int, timeout: float = 120) -> list[Path]:
    """The payloads of both slots once each is a complete copy (header written, payload of its declared
    size): the copy in flight when the owner was held can still be being written (CI: an empty file)."""
    from truestep.checkpoint.memory.holder import SLOTS, Holder

    deadline = time.time() + timeout
    while True:
        found = copies_of(tmp_path, holder, owner)
        held = Holder(found[0].parent) if found else None
        if held is not None and all(held.header(owner, slot) is not None for slot in SLOTS):
            return [held.payload(owner, slot) for slot in SLOTS]
        if time.time() > deadline:
            raise AssertionError(f"no two complete copies of rank {owner}'s state on rank {holder}: {found}")
        time.sleep(0.1)


def assert_restored_from_memory(run: Path, output: str) -> dict:
    (restore,) = events(run, "memory_restore")
    assert restore["source"] == "memory" and restore["sources"] == {"0": 0, "1": 0}, restore
    assert restore["from_buddies"] == [1] and restore["steps_lost"] <= 1, restore
    assert events(run, "checkpoint_restore") == []  # the disk was not needed
    assert f"restored step {restore['step']} from memory" in output
    # A memory restore loads the weights, like a disk one: no init is drawn; finding and checking the
    # copies is the start-up's verify phase, copying them into the model its load phase.
    (began,) = [e for e in events(run, "run_start") if e["attempt"] == restore["attempt"]]
    phases = began["startup_phases"]
    assert phases["init"] == 0 and phases["verify"] > 0 and phases["load"] > 0, phases
    (check,) = self_checks(run)
    assert_checked_as_it_could_be(restore, check)
    return restore


def assert_checked_as_it_could_be(restore: dict, check: dict) -> None:
    """A restore that lost a step is replayed against that step's pre-fault line and verified (the buddy's
    optimizer state proven by its digest covers the rest). Whether the failed attempt logged the step after
    the restored one is a race with the failure (its line comes after the snapshot's exchange): a restore
    that lost nothing has nothing to replay against, and says so (unverified) rather than claim a proof."""
    if restore["steps_lost"] >= 1:
        assert check["event"] == "resume_verified", (restore, check)
    else:
        assert check["event"] == "resume_unverified" and check["reason"], (restore, check)


def test_a_killed_rank_is_restored_from_its_buddys_memory(reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = supervise(run, *memory(tmp_path), faults=hold(rank=1))
    os.kill(wait_until_held(run, rank=1), signal.SIGKILL)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    assert supervisor_events(run, "memory_lost")[0]["ranks"] == [1]
    restore = assert_restored_from_memory(run, finish.last_output)  # type: ignore[attr-defined]
    # Held before step 8: step 7 was done, its snapshot taken but not yet agreed (agreed at the next
    # boundary), so step 6 is restored and one step is lost.
    assert (restore["step"], restore["steps_lost"]) == (HOLD_STEP - 2, 1)
    assert_matches_reference(run, reference)


def test_a_hung_rank_is_restored_from_its_buddys_memory(reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = supervise(run, *memory(tmp_path), faults=hold(rank=1))
    os.kill(wait_until_held(run, rank=1), signal.SIGSTOP)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    failure = supervisor_events(run, "failure_detected")[0]
    # A stopped rank's heartbeat goes stale and /proc shows it stopped: either may be seen first.
    assert failure["kind"] in ("stale_heartbeat", "process_stopped") and failure["rank"] == 1, failure
    assert supervisor_events(run, "memory_lost")[0]["ranks"] == [1]
    assert_restored_from_memory(run, finish.last_output)  # type: ignore[attr-defined]
    assert_matches_reference(run, reference)


def test_a_rank_killed_while_its_snapshot_is_replicated(reference: Path, tmp_path: Path) -> None:
    """The snapshot in flight was never agreed: the previous agreed one (the other slot) serves."""
    run = tmp_path / "run"
    proc = supervise(run, *memory(tmp_path), faults="kill:at=snapshot:replicating:rank=1:step=10")
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    restore = assert_restored_from_memory(run, finish.last_output)  # type: ignore[attr-defined]
    assert restore["step"] == 9, restore
    assert_matches_reference(run, reference)


def test_the_buddy_killed_during_the_recovery_falls_back_to_disk(reference: Path, tmp_path: Path) -> None:
    """Rank 1 dies; as the next attempt restores it from rank 0's memory, rank 0 dies too: both
    memories are lost, and the attempt after that restores from disk, saying why."""
    run = tmp_path / "run"
    faults = f"{hold(rank=1)};kill:at=restore:rank=0:restart=1"
    # The step-5 checkpoint is committed before rank 1 is held (a synchronous save): an async one may
    # still be uncommitted when the ranks stop meeting, and then there is no disk to fall back to.
    proc = supervise(run, *memory(tmp_path), "--checkpoint.async_save=false", faults=faults, restarts=3)
    os.kill(wait_until_held(run, rank=1), signal.SIGKILL)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    assert [e["ranks"] for e in supervisor_events(run, "memory_lost")] == [[1], [0]]
    (skipped,) = [e for e in events(run, "memory_restore_skipped") if e["attempt"] == 2]
    assert "the memory of every rank that held one was lost" in skipped["reason"], skipped
    assert events(run, "memory_restore") == []
    assert events(run, "checkpoint_restore")[-1]["source"] == "disk"
    assert "recovering from disk: no rank holds an agreed snapshot" in finish.last_output  # type: ignore[attr-defined]
    assert_matches_reference(run, reference)


def test_a_flipped_byte_in_a_buddys_copy_is_caught_and_the_disk_serves(
    reference: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    proc = supervise(run, *memory(tmp_path), faults=hold(rank=1))
    pid = wait_until_held(run, rank=1)
    copies = complete_copies(tmp_path, holder=0, owner=1)
    assert len(copies) == 2, copies
    for copy in copies:  # both slots: whichever the restore picks
        data = bytearray(copy.read_bytes())
        data[len(data) // 2] ^= 0x01
        copy.write_bytes(bytes(data))
    os.kill(pid, signal.SIGKILL)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    (skipped,) = [e for e in events(run, "memory_restore_skipped") if e["attempt"] == 1]
    assert "SHA-256" in skipped["reason"], skipped
    assert events(run, "memory_restore") == [] and events(run, "checkpoint_restore")[-1]["source"] == "disk"
    assert_matches_reference(run, reference)
