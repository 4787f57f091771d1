"""What a snapshot costs the step it overlaps is in its event (snapshot_agreed.wait_s): the optimizer
update waits for the copy of the state it changes, and that wait was logged nowhere, so neither the
report nor `truestep plan --from` could charge it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness import events, run_in_process
from truestep.checkpoint.memory import snapshotter

SLOW_S = 0.4


@pytest.mark.slow  # over ~1.5 s here: the whole suite, not the fast tier
def test_the_optimizer_wait_for_a_slow_capture_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write = snapshotter.write_payload

    def slow_write(path: Path, tensors: list) -> tuple[str, str]:
        time.sleep(SLOW_S)  # a capture slower than the tiny model's forward and backward
        return write(path, tensors)

    monkeypatch.setattr(snapshotter, "write_payload", slow_write)
    code = run_in_process(
        tmp_path / "run",
        "--train.max_steps=4",
        "--checkpoint.interval=0",
        "--resilience.snapshot_every_steps=1",
        f"--resilience.snapshot_dir={tmp_path / 'memory'}",
    )
    assert code == 0
    agreed = events(tmp_path / "run", "snapshot_agreed")
    assert [e["step"] for e in agreed] == [1, 2, 3]  # step 4's is never agreed: the run ended
    # Every snapshot but the last was waited for by the next update, most of the capture's sleep.
    assert all(e["wait_s"] > SLOW_S / 2 for e in agreed), agreed
    assert all(e["wait_s"] <= e["capture_s"] + 0.05 for e in agreed), agreed
