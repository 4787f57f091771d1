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


def settled_copies(
    tmp_path: Path, holder: int, owner: int, steps: set[int], timeout: float = 120
) -> list[Path]:
    """The payloads of `owner`'s copies on `holder` once they are complete copies of exactly `steps` (header
    written, payload of its declared size). With the owner held, the copy of the step before the hold is
    still being received when the hold begins (CI: an empty file, a slot whose header was just removed);
    once it is complete nothing writes either slot until the hold ends."""
    from truestep.checkpoint.memory.holder import SLOTS, Holder

    deadline = time.time() + timeout
    while True:
        found = copies_of(tmp_path, holder, owner)
        held = Holder(found[0].parent) if found else None
        headers = [held.header(owner, slot) for slot in SLOTS] if held is not None else []
        if held is not None and {h.step for h in headers if h is not None} == steps:
            return [held.payload(owner, slot) for slot in SLOTS]
        if time.time() > deadline:
            raise AssertionError(
                f"no complete copies of rank {owner}'s steps {steps} on rank {holder}: {found}"
            )
        time.sleep(0.05)


def flip_a_byte(path: Path) -> None:
    """In place, as a memory fault would: the file keeps its size. (Rewriting it whole truncates it first,
    and the holder, which maps the file while it receives a copy, dies of SIGBUS: another failure.)"""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


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
    # A synchronous save: the step-5 checkpoint the disk restores is committed before the hold (an async one
    # may still be uncommitted when rank 1 is killed on a loaded machine, and then there is no disk).
    proc = supervise(run, *memory(tmp_path), "--checkpoint.async_save=false", faults=hold(rank=1))
    pid = wait_until_held(run, rank=1)
    # Held before step 8: the copies rank 0 holds of rank 1 are step 6 (agreed) and step 7 (arriving).
    copies = settled_copies(tmp_path, holder=0, owner=1, steps={HOLD_STEP - 2, HOLD_STEP - 1})
    for copy in copies:  # both slots: whichever the restore picks
        flip_a_byte(copy)
    os.kill(pid, signal.SIGKILL)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    assert supervisor_events(run, "memory_lost")[0]["ranks"] == [1]
    (skipped,) = [e for e in events(run, "memory_restore_skipped") if e["attempt"] == 1]
    assert "SHA-256" in skipped["reason"], skipped
    assert events(run, "memory_restore") == [] and events(run, "checkpoint_restore")[-1]["source"] == "disk"
    assert_matches_reference(run, reference)
