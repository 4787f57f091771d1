"""Hostile checkpoints meet a real resume (issue 12): a crafted newest checkpoint is never loaded as if
it were good, the run falls back to the older one and ends bitwise equal to the reference; refusals
and a full disk end in one line and a documented exit code.

Each case works on its own copy of the shared reference run (tests/conftest.py, 10 steps, checkpoints
at 3, 6, 9, 10) cut back to steps 3 and 6, and runs `truestep train` once.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

import harness
from ckpt_cases import RUN, assert_same_trajectory, attempt_events, ckpt, copy_run, file_hashes, last_attempt
from hostile_cases import SHARD, edit_metadata
from truestep.checkpoint.catalog import QUARANTINE, step_dir_name

pytestmark = pytest.mark.multiprocess


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """stderr without DCP's own UserWarning about running without a process group (two lines each)."""
    lines = proc.stderr.splitlines()
    keep = []
    for index, line in enumerate(lines):
        warning = "UserWarning" in line or (index and "UserWarning" in lines[index - 1])
        if line.strip() and not warning:
            keep.append(line)
    return keep


def one_line(proc: subprocess.CompletedProcess) -> str:
    lines = stderr_lines(proc)
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-4000:]
    return lines[0]


def _storage_to_step3(metadata) -> None:
    for info in metadata.storage_data.values():
        info.relative_path = f"../{step_dir_name(3)}/{SHARD}"


def _bf16_norm(metadata) -> None:
    metadata.state_dict_metadata["model.norm.weight"].properties.dtype = torch.bfloat16


@pytest.mark.parametrize(
    "case,craft,why,event",
    [
        (
            "storage-path-of-step-3",
            _storage_to_step3,
            "storage path '../step_00000003/__0_0.distcp' is not a plain file name inside the checkpoint",
            "checkpoint_quarantined",
        ),
        (
            "dtype-the-bytes-contradict",
            _bf16_norm,
            "failed to load: model.norm.weight: stored as float32, the metadata declares bfloat16",
            "checkpoint_quarantined",
        ),
    ],
)
def test_a_crafted_newest_checkpoint_is_quarantined_and_the_resume_is_bitwise(
    case, craft, why, event, reference, tmp_path
):
    """The storage path case verified and resumed step 3's weights as step 6 (a wrong resume reported
    as correct); now it fails verification. The dtype case verifies (shards are only hashed) but fails
    while loading: it is quarantined in process and the resume falls back, every piece of state from
    step 3. Both then recompute steps 4-10 bit for bit."""
    run = copy_run(reference, tmp_path / "run", keep=(3, 6))
    edit_metadata(ckpt(run, 6), craft)
    crafted = file_hashes(ckpt(run, 6))
    proc = harness.launch(run, *RUN, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    attempt = last_attempt(run)
    (quarantined,) = attempt_events(run, event, attempt)
    assert quarantined["step"] == 6 and why in quarantined["reason"], quarantined
    (moved,) = (run / "checkpoints" / QUARANTINE).iterdir()
    assert file_hashes(moved) == crafted  # kept as it was found, for the post-mortem
    assert [e["step"] for e in attempt_events(run, "checkpoint_restore", attempt)] == [3]
    assert_same_trajectory(run, reference, attempt=attempt, first_step=4)


def test_a_checkpoint_beyond_max_steps_does_not_complete_the_run(reference, tmp_path):
    """A checkpoint at step 10 resumed by a 6-step run (max_steps allowed to change): refused in one
    line (exit 3), not "completed" with nothing trained."""
    run = copy_run(reference, tmp_path / "run")
    before = (run / "metrics.jsonl").read_bytes()
    proc = harness.launch(
        run, "--train.max_steps=6", "--checkpoint.allow_config_change=true", *RUN[1:], check=False
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "is at step 10, beyond train.max_steps=6" in one_line(proc)
    assert (run / "metrics.jsonl").read_bytes() == before
    assert harness.events(run, "run_refused")[-1]["exit_code"] == 3


def test_a_quarantine_that_is_a_file_is_one_line_and_exit_3(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run", keep=(3, 6))
    (ckpt(run, 6) / SHARD).write_bytes(b"torn")
    (run / "checkpoints" / QUARANTINE).write_text("in the way")
    proc = harness.launch(run, *RUN, check=False)
    assert proc.returncode == 3
    assert "quarantine: that path is not a directory. Move it out of the way" in one_line(proc)
    assert (ckpt(run, 6) / SHARD).read_bytes() == b"torn"  # nothing moved, nothing trained


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unshare -m and tmpfs mounts (root)")
def test_a_full_disk_says_no_space_left_and_where(tmp_path):
    """A real full filesystem (a 3 MB tmpfs in a private mount namespace) fills at the second checkpoint:
    one line naming the checkpoint and "no space left on device", exit 6 (not requeued), instead of
    torch's "unexpected pos 704 vs 598" and a traceback."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    args = ["train", "tiny", f"--run.dir={mount}/run", *harness.TINY, *RUN]
    script = f'mount -t tmpfs -o size=3m tmpfs "{mount}" && exec "$0" -m truestep "$@"'
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, sys.executable, *args],
        env=harness.truestep_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 6, proc.stderr[-4000:]
    line = one_line(proc)
    assert f"writing checkpoint {mount}/run/checkpoints/step_00000006: no space left on device" in line, line
