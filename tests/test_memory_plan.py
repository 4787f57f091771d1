"""The memory path's decisions, in process: who holds whose copy, which snapshot a restore uses (or why
none), what a copy's header must say, and the start-up refusal when snapshots would not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import run_in_process
from truestep.checkpoint.memory.holder import CopyHeader, Holder, SnapshotFormatError
from truestep.checkpoint.memory.replicate import holders_of, owners_held_by
from truestep.checkpoint.memory.restore import NONE, MemoryUnavailable, plan


def test_buddies_are_on_another_node_and_never_the_rank_itself() -> None:
    assert holders_of(0, world=2, per_node=2, replicas=1) == [1]
    assert holders_of(0, world=4, per_node=2, replicas=1) == [2]  # two nodes: the same slot, next node
    assert holders_of(3, world=4, per_node=2, replicas=1) == [1]
    assert holders_of(0, world=1, per_node=1, replicas=1) == []
    assert len(set(holders_of(0, world=4, per_node=2, replicas=3))) == 3
    for world, per_node in ((2, 2), (4, 2), (6, 3)):
        for rank in range(world):
            assert all(
                rank in holders_of(o, world, per_node, 1) for o in owners_held_by(rank, world, per_node, 1)
            )


def row(agreed: int, own: tuple[int, int], held: tuple[int, int]) -> list[int]:
    return [agreed, *own, *held]


def test_the_newest_agreed_step_every_rank_has_a_copy_of() -> None:
    # Rank 1's memory was lost (all NONE); rank 0 holds its own 5 and 6 and rank 1's 5 and 6; 6 agreed.
    rows = [row(6, (5, 6), (5, 6)), row(NONE, (NONE, NONE), (NONE, NONE))]
    chosen = plan(rows, world=2, per_node=2, replicas=1, disk_newest=4)
    assert (chosen.step, chosen.sources) == (6, (0, 0))


def test_a_step_in_flight_is_never_used_before_it_is_agreed() -> None:
    rows = [row(5, (5, 6), (5, 6)), row(NONE, (NONE, NONE), (NONE, NONE))]
    assert plan(rows, world=2, per_node=2, replicas=1, disk_newest=0).step == 5


@pytest.mark.parametrize(
    ("rows", "disk", "said"),
    [
        ([row(NONE, (NONE, NONE), (NONE, NONE))] * 2, -1, "no rank holds an agreed snapshot"),
        ([row(6, (5, 6), (5, 6))] * 2, 6, "not older than the last agreed snapshot"),
        ([row(6, (5, 6), (NONE, NONE)), row(NONE, (NONE, NONE), (NONE, NONE))], 0, "rank 1's state"),
    ],
    ids=["nothing-agreed", "disk-as-new", "rank-and-buddy-lost"],
)
def test_when_memory_cannot_serve_it_says_why(rows: list[list[int]], disk: int, said: str) -> None:
    with pytest.raises(MemoryUnavailable, match=said):
        plan(rows, world=2, per_node=2, replicas=1, disk_newest=disk)


def header(**change: object) -> CopyHeader:
    fields = {
        "owner": 1,
        "step": 6,
        "nbytes": 8,
        "sha256": "a" * 64,
        "param_digest": "b" * 64,
        "identity": {"run_id": "r"},
        "table": [
            {"part": "model", "key": "/w", "dtype": "torch.float32", "shape": [2], "offset": 0, "nbytes": 8}
        ],
        "rank_state": {},
    }
    return CopyHeader(**{**fields, **change})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        {"step": -1},
        {"sha256": "zz"},
        {"table": [{"part": "model", "key": "/w", "dtype": "f", "shape": [2], "offset": 4, "nbytes": 8}]},
        {"identity": "not a dict"},
    ],
    ids=["negative-step", "bad-digest", "entry-past-the-end", "identity"],
)
def test_a_malformed_header_is_never_a_copy(bad: dict, tmp_path: Path) -> None:
    with pytest.raises(SnapshotFormatError):
        CopyHeader.parse(header(**bad).to_json())
    holder = Holder(tmp_path)
    holder.ensure()
    holder.payload(1, 0).write_bytes(b"x" * 8)
    holder.header_path(1, 0).write_bytes(header(**bad).to_json())
    assert holder.copies(1) == {}
    holder.header_path(1, 0).write_bytes(header().to_json())
    assert list(holder.copies(1)) == [6]
    holder.payload(1, 0).write_bytes(b"x" * 7)  # a payload shorter than its header says: torn
    assert holder.copies(1) == {}


def test_snapshots_that_do_not_fit_are_refused_at_start(tmp_path: Path, capsys) -> None:
    code = run_in_process(
        tmp_path / "run",
        "--train.max_steps=2",
        "--schedule.warmup_steps=1",
        "--resilience.snapshot_every_steps=1",
        f"--resilience.snapshot_dir={tmp_path / 'memory'}",
        "--resilience.snapshot_memory_fraction=1e-12",
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "snapshots do not fit host memory" in err and "Traceback" not in err
