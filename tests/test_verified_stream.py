"""A verified load streams each item into its target once its hash matched (checkpoint/verified_read.py):
a checkpoint whose last item is bad has already put every earlier item into the model and optimizer when
the load fails. None of that may reach a step: the resume quarantines it and either loads the older
checkpoint over everything or starts fresh from a full re-initialization, and the run is bit for bit the
failure-free one. (Rank disagreement itself: tests/test_integrity_ranks.py; the run-level fallback
across ranks: tests/test_integrity_fallback.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import INPROCESS_JOB, events, loss_bits_by_step, run_in_process
from truestep.checkpoint.catalog import step_dir_name
from truestep.checkpoint.safe_dcp import read_dcp_metadata

RUN = [*INPROCESS_JOB, "--checkpoint.interval=2"]  # the trajectory of conftest's inprocess_reference


def _flip_last_item(ckpt_dir: Path) -> None:
    """A byte in the item stored last in its file: every item before it loads first."""
    info = max(read_dcp_metadata(ckpt_dir).storage_data.values(), key=lambda i: i.offset)
    path = ckpt_dir / info.relative_path
    data = bytearray(path.read_bytes())
    data[info.offset + info.length // 2] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("stop_at", "falls_back_to"), [(6, 4), (2, None)])
def test_a_partly_loaded_checkpoint_never_reaches_a_step(
    inprocess_reference: Path, tmp_path: Path, monkeypatch, stop_at: int, falls_back_to: int | None
) -> None:
    from truestep.checkpoint.safe_dcp import SafeFileSystemReader

    run = tmp_path / "run"
    assert run_in_process(run, *RUN, f"--train.stop_at_step={stop_at}") == 0
    _flip_last_item(run / "checkpoints" / step_dir_name(stop_at))

    loaded: list[str] = []
    real = SafeFileSystemReader._load_item

    def counted(self, view, item, planner) -> None:
        loaded.append(item.storage_index.fqn)
        real(self, view, item, planner)

    monkeypatch.setattr(SafeFileSystemReader, "_load_item", counted)
    assert run_in_process(run, *RUN, "--checkpoint.allow_fresh_start=true") == 0

    (quarantined,) = events(run, "checkpoint_quarantined")
    assert quarantined["step"] == stop_at and "SHA-256 mismatch (corrupted)" in quarantined["reason"]
    restored = [e["step"] for e in events(run, "checkpoint_restore")]
    assert restored == ([falls_back_to] if falls_back_to else [])
    if falls_back_to is None:
        assert [e["after_failed_loads"] for e in events(run, "state_reset")] == [1]
    assert len(loaded) > 10  # the failed load had streamed its earlier items into the targets
    assert loss_bits_by_step(run) == loss_bits_by_step(inprocess_reference)  # each step's last run
