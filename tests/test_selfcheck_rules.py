"""The resume self-check says only what it saw (train/selfcheck/judge.py), and a restore is checked against
what the checkpoint says about itself, never against a log line (checkpoint/save_record.py).

In-process runs of the tiny model (harness.run_in_process); the disk states a hard failure leaves are
made by removing the checkpoint the failure would have torn, which the resolver would have quarantined.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import INPROCESS_JOB, events, launch, run_in_process
from truestep.checkpoint.catalog import SAVE_RECORD, step_dir_name
from truestep.config.load import load_config

JOB = [*INPROCESS_JOB, "--checkpoint.async_save=false"]


def checkpoints(run: Path) -> Path:
    return run / "checkpoints"


def self_checks(run: Path) -> list[dict]:
    return [
        e for e in events(run) if e["event"] in ("resume_verified", "resume_unverified", "resume_diverged")
    ]


@pytest.fixture(scope="module")
def stopped_at_6(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stopped gracefully at step 6 (checkpoints at 4 and 6, steps 1..6 logged)."""
    run = tmp_path_factory.mktemp("stopped6") / "run"
    assert run_in_process(run, *JOB, "--train.stop_at_step=6") == 0
    return run


def as_if_killed_after(stopped: Path, tmp_path: Path) -> Path:
    """The run directory a hard kill after step 6 would leave: step 6's save never committed (set aside
    here), so a resume restores step 4 and replays steps 5..6 against their logged lines."""
    run = tmp_path / "run"
    shutil.copytree(stopped, run, symlinks=True)
    shutil.rmtree(checkpoints(run) / step_dir_name(6))
    return run


def drop_metrics_after(run: Path, step: int) -> None:
    path = run / "metrics.jsonl"
    kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
    path.write_text("\n".join(kept) + "\n")


def test_two_replayed_steps_verify_the_resume(stopped_at_6: Path, tmp_path: Path, capsys) -> None:
    run = as_if_killed_after(stopped_at_6, tmp_path)
    assert run_in_process(run, *JOB) == 0
    (check,) = self_checks(run)
    assert check["event"] == "resume_verified" and check["steps_compared"] == 2
    assert "resume verified: steps 5..6 replayed bit for bit" in capsys.readouterr().err


@pytest.mark.parametrize("switch", ["", "--checkpoint.restore_optimizer_state=false"])
def test_one_replayed_step_cannot_verify_the_optimizer_state(
    switch: str, stopped_at_6: Path, tmp_path: Path, capsys
) -> None:
    """A kill right after a commit (or a sync save) leaves one step to replay: its loss is computed before
    the update the restored moments shape, so it cannot tell restored moments from fresh ones. Without
    this rule the resume said "verified" with the optimizer restore off."""
    run = as_if_killed_after(stopped_at_6, tmp_path)
    drop_metrics_after(run, 5)  # the fault came after step 5: one pre-fault step to replay
    assert run_in_process(run, *JOB, *([switch] if switch else [])) == 0
    (check,) = self_checks(run)
    assert check["event"] == "resume_unverified", check
    assert check["steps_compared"] == 1 and "optimizer state" in check["reason"]
    err = capsys.readouterr().err
    assert "resume unverified: one replayed step cannot show the restored optimizer state" in err
    assert "bit for bit" not in err


@pytest.fixture(scope="module")
def stopped_at_4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A graceful stop at step 4: its emergency save is the checkpoint, its witness in the event log."""
    run = tmp_path_factory.mktemp("stopped4") / "run"
    assert run_in_process(run, *JOB, "--train.stop_at_step=4") == 0
    (witness,) = events(run, "stop_witness")
    assert witness["step"] == 4 and {"lr", "tokens_seen", "data_position"} <= set(witness)
    return run


def copied(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run, target, symlinks=True)
    return target


def test_the_stop_witness_verifies_a_graceful_resume(stopped_at_4: Path, tmp_path: Path, capsys) -> None:
    run = copied(stopped_at_4, tmp_path)
    assert run_in_process(run, *JOB) == 0
    (check,) = self_checks(run)
    assert check["event"] == "resume_verified" and check["witness"] is True
    assert set(check["compared"]) >= {"optimizer_fingerprint", "lr", "tokens_seen"}
    assert "resume verified against the stop witness: step 5 bit for bit" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change", [("optim", "lr", 1.001), ("schedule", "min_lr_ratio", 2.0)], ids=["lr", "min_lr_ratio"]
)
def test_an_allowed_config_change_is_said_never_bit_for_bit(
    change: tuple[str, str, float], stopped_at_4: Path, tmp_path: Path, capsys
) -> None:
    section, key, factor = change
    value = getattr(getattr(load_config("tiny", []), section), key) * factor
    run = copied(stopped_at_4, tmp_path)
    switches = [f"--{section}.{key}={value!r}", "--checkpoint.allow_config_change=true"]
    assert run_in_process(run, *JOB, *switches) == 0
    (check,) = self_checks(run)
    assert check["event"] == "resume_unverified", check
    assert "the config changed at the resume" in check["reason"] and key in check["reason"]
    err = capsys.readouterr().err
    assert "bit for bit" not in err and "DIVERGED" not in err


def test_a_missing_stop_witness_is_said_in_the_resume_line(
    stopped_at_4: Path, tmp_path: Path, capsys
) -> None:
    run = copied(stopped_at_4, tmp_path)
    path = run / "events.jsonl"
    lines = [line for line in path.read_text().splitlines() if json.loads(line)["event"] != "stop_witness"]
    path.write_text("\n".join(lines) + "\n")  # the witness lost (a stop cut short, a lost log)
    assert run_in_process(run, *JOB) == 0
    (check,) = self_checks(run)
    assert check["event"] == "resume_unverified" and "no stop witness of step 4" in check["reason"]
    assert "no stop witness of step 4 was recorded" in capsys.readouterr().err


def test_a_forged_log_line_does_not_outrank_the_checkpoint(stopped_at_4: Path, tmp_path: Path) -> None:
    """The digest a restore is checked against is the checkpoint's own (save.json, bound by the manifest
    and the marker): forged `checkpoint_save` lines appended to events.jsonl change nothing."""
    run = copied(stopped_at_4, tmp_path)
    (save,) = events(run, "checkpoint_save")
    forged = {**save, "param_digest": "0" * 64, "time": save["time"] + 1}
    with (run / "events.jsonl").open("a") as f:
        f.write(json.dumps(forged) + "\n" + json.dumps({**forged, "attempt": 0}) + "\n")
    assert run_in_process(run, *JOB) == 0
    (restore,) = events(run, "checkpoint_restore")
    assert restore["step"] == 4 and restore["restored_digest"] == "matches"
    assert events(run, "checkpoint_quarantined") == [] and events(run, "restore_digest_mismatch") == []


def test_a_tampered_save_record_fails_the_checkpoint(stopped_at_4: Path, tmp_path: Path, capsys) -> None:
    run = copied(stopped_at_4, tmp_path)
    record = checkpoints(run) / step_dir_name(4) / SAVE_RECORD
    blob = json.loads(record.read_text())
    record.write_text(json.dumps({**blob, "param_digest": "0" * 64}))
    assert run_in_process(run, *JOB) == 3  # committed work exists, none verifies: refused, not step 0
    (quarantined,) = events(run, "checkpoint_quarantined")
    assert quarantined["step"] == 4 and SAVE_RECORD in quarantined["reason"]


@pytest.mark.multiprocess
def test_a_graceful_resume_onto_another_layout_is_never_diverged(tmp_path: Path, capsys) -> None:
    """Stopped at 2 (FSDP) ranks, resumed on one: batches, RNG streams and optimizer shards differ by
    design, so the witness compares only the layout-invariant data position, learning rate and tokens
    seen -- every legitimate resume onto another layout used to be `resume_diverged`."""
    run = tmp_path / "run"
    launch(run, *JOB, "--train.stop_at_step=4", nproc=2)
    assert run_in_process(run, *JOB) == 0
    (restore,) = events(run, "checkpoint_restore")
    assert restore["layout_changed"] is True
    (check,) = self_checks(run)
    assert check["event"] == "resume_unverified", check
    assert check["compared"] == ["data_position", "lr", "tokens_seen"] and check["fields"] == []
    assert "the layout changed" in check["reason"] and "DIVERGED" not in capsys.readouterr().err
