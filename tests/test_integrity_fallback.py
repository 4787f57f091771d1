"""Training-level: a byte flipped in rank 1's shard of the newest checkpoint passes the structural checks,
is found by whichever rank reads it while loading (rank 1 at the same layout, the one process of a
resharded resume), and every rank agrees: the checkpoint is quarantined and resume falls back to the
older one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness import LAYOUTS, events, launch, metrics

pytestmark = pytest.mark.multiprocess

SAVE = ["--train.max_steps=6", "--checkpoint.interval=2", "--schedule.warmup_steps=2"]
SHARD = "__1_0.distcp"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fsdp2 run stopped at step 4: checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("fsdp2-saved") / "run"
    launch(run, *SAVE, "--train.stop_at_step=4", nproc=2)
    return run


@pytest.mark.parametrize(("resumed", "finder"), [("fsdp2", 1), ("single", 0)])
def test_flipped_byte_in_rank1s_shard_is_found_while_loading_and_resume_falls_back(
    saved: Path, resumed: str, finder: int, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    shard = run / "checkpoints" / "step_00000004" / SHARD
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40
    shard.write_bytes(bytes(data))
    nproc, extra = LAYOUTS[resumed]
    launch(run, *SAVE, *extra, nproc=nproc)
    (quarantined,) = events(run, "checkpoint_quarantined")
    assert quarantined["step"] == 4
    assert quarantined["reason"].startswith(
        f"failed to load: {SHARD}: SHA-256 mismatch (corrupted) in bytes "
    )
    assert quarantined["reason"].endswith(f"found by rank {finder}"), quarantined["reason"]
    assert [e["step"] for e in events(run, "checkpoint_restore")] == [2]
    assert [m["step"] for m in metrics(run)][-1] == 6
