"""The console of a long job, as a log file sees it (stderr is not a terminal under pytest): a start
banner (parameters, layout, data, where the weights came from), a plain line per log interval instead of
a progress bar, narration on lines of its own, and optional W&B output (offline: no network)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from harness import metrics, run_in_process
from truestep.core.errors import ExitCode

JOB = [
    "--metrics.progress=true",
    "--metrics.step_lines=true",
    "--metrics.banner=true",
    "--checkpoint.interval=0",
    "--schedule.warmup_steps=1",
]


def _stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    assert "\r" not in err and "it/s" not in err, "a progress bar was drawn into a non-terminal"
    return err.splitlines()


def test_a_log_file_gets_a_banner_plain_step_lines_and_narration_on_its_own_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    assert run_in_process(first, *JOB, "--train.max_steps=4", "--metrics.log_every=2") == 0
    lines = _stderr_lines(capsys)
    banner = next(i for i, line in enumerate(lines) if line.startswith("truestep train: training"))
    assert "from step 0 of 4" in lines[banner] and "parameters (dim 64, 2 layers, vocab 512)" in lines[banner]
    assert lines[banner + 1].startswith("  1 rank(s) = dp 1 x tp 1 on cpu") and "float32" in lines[banner + 1]
    assert "8 x 32 = 256 tokens per step" in lines[banner + 2]
    assert "initialized from train.seed (no init_from)" in lines[banner + 2]
    steps = [line for line in lines if line.startswith("truestep train: step ")]
    assert [line.split(" | ")[0] for line in steps] == [
        "truestep train: step 2/4",
        "truestep train: step 4/4",
    ]
    assert all(k in steps[0] for k in (" | loss ", " | lr ", " | grad norm ", " tok/s | ", " | peak mem ")), (
        steps[0]
    )
    assert (
        lines[banner + 3].startswith("  memory estimate ") and " per rank (parameters " in lines[banner + 3]
    )

    weights = str(first / "checkpoints" / "step_00000004")
    job = [*JOB, "--train.max_steps=3", f"--checkpoint.init_from={weights}"]
    assert run_in_process(second, *job, "--train.stop_at_step=2") == 0
    lines = _stderr_lines(capsys)
    said = "\n".join(lines)
    assert f"weights from init_from {weights} (loaded" in said, said
    assert run_in_process(second, *job) == 0  # resumes at step 2 (init_from is ignored then)
    lines = _stderr_lines(capsys)
    resumed = [line for line in lines if line.startswith("truestep train: resuming from step 2")]
    assert len(resumed) == 1, lines
    assert any("resumed at step 2 of 3" in line for line in lines)
    glued = [line for line in lines if not line.startswith(("truestep", "  "))]
    assert not glued, glued  # nothing glued onto another line


def test_step_lines_can_be_switched_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_in_process(tmp_path, *JOB, "--train.max_steps=2", "--metrics.step_lines=false") == 0
    assert not [line for line in _stderr_lines(capsys) if line.startswith("truestep train: step ")]


def test_wandb_without_the_package_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: `import wandb` fails
    assert run_in_process(tmp_path, *JOB, "--train.max_steps=2", "--metrics.wandb=offline") == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "metrics.wandb=offline needs the wandb package: pip install 'truestep[wandb]'" in err
    assert "Traceback" not in err


def _history(run_dir: Path) -> list[dict[str, str]]:
    """The history rows of the offline W&B run file (a LevelDB-style log of protobuf Records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, pending, rows = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a record header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending, pos = pending + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            break
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                )
    return rows


@pytest.mark.slow
def test_wandb_offline_logs_every_step_without_a_network(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("wandb")
    assert run_in_process(tmp_path, *JOB, "--train.max_steps=3", "--metrics.wandb=offline") == 0
    rows = _history(tmp_path)
    losses = {int(row["_step"]): float(row["train/loss"]) for row in rows if "train/loss" in row}
    logged = {m["step"]: m["loss"] for m in metrics(tmp_path)}
    assert losses == logged
