"""One rank run in-process through its front door (train/rank.py: `run_rank` returns; nothing exits).

The fast tier's trainer tests: a single-process rank of the tiny model trains, saves, resumes bit for
bit, keeps its checkpoints wherever `checkpoint.dir` says (and training, `ckpt` and the analysis find
them in the same place), begins its own attempts without a supervisor, and leaves the test process as
it found it (signal handlers, threads, armed faults).
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from harness import INPROCESS_JOB, events, loss_bits_by_step, metrics, run_in_process
from truestep.analysis.state import checkpoints, distances
from truestep.checkpoint.catalog import checkpoint_root, run_checkpoint_root
from truestep.cli.ckpt import ckpt_main
from truestep.config.load import load_config
from truestep.core.errors import RefusedError
from truestep.core.launch import Launch, LaunchError
from truestep.faults import hooks
from truestep.train.rank import run_rank

JOB = INPROCESS_JOB


def test_a_rank_returns_its_exit_code_and_leaves_the_process_as_it_found_it(tmp_path: Path) -> None:
    handlers = {
        s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)
    }
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    assert (
        run_in_process(
            tmp_path, "--train.max_steps=2", "--checkpoint.interval=0", "--schedule.warmup_steps=1"
        )
        == 0
    )
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2]
    assert events(tmp_path, "run_end")[-1]["reason"] == "completed"
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert signal.set_wakeup_fd(wakeup) == wakeup
    names = {t.name for t in threading.enumerate()}
    assert not names & {"truestep-heartbeat", "truestep-signals", "truestep-lease"}, names
    assert hooks.armed() == [] and hooks._CONTEXT == {}


def test_a_rank_stopped_at_a_step_resumes_bit_for_bit(inprocess_reference: Path, tmp_path: Path) -> None:
    assert run_in_process(tmp_path, *JOB, "--train.stop_at_step=4") == 0
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2, 3, 4]
    assert run_in_process(tmp_path, *JOB) == 0
    assert [e["attempt"] for e in events(tmp_path, "run_start")] == [0, 1]  # begun by rank 0 itself
    assert events(tmp_path, "checkpoint_restore")[-1]["path"].endswith("step_00000004")
    assert loss_bits_by_step(tmp_path) == loss_bits_by_step(inprocess_reference)
    assert (
        events(tmp_path, "run_end")[-1]["param_digest"]
        == events(inprocess_reference, "run_end")[-1]["param_digest"]
    )


def test_checkpoints_kept_elsewhere_are_found_by_training_ckpt_and_the_analysis(
    inprocess_reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """checkpoint.dir outside the run directory: one answer to "where are the checkpoints". The
    analysis used to look only in <run>/checkpoints/ and found nothing (no state distances)."""
    run, elsewhere = tmp_path / "run", tmp_path / "kept-elsewhere"
    assert run_in_process(run, *JOB, f"--checkpoint.dir={elsewhere}", "--train.stop_at_step=4") == 0
    assert run_in_process(run, *JOB, f"--checkpoint.dir={elsewhere}") == 0  # resumed from there
    assert events(run, "checkpoint_restore")[-1]["path"] == str(elsewhere / "step_00000004")
    assert not (run / "checkpoints").exists()
    assert run_checkpoint_root(run) == elsewhere == checkpoint_root(run)
    assert sorted(checkpoints(run)) == [4, 8] == sorted(checkpoints(inprocess_reference))
    found = distances(run, inprocess_reference)
    assert [d.step for d in found] == [4, 8] and not any(d.nonzero for d in found)
    assert ckpt_main(["list", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"checkpoints under {elsewhere}" in out and "step_00000008" in out


def test_a_run_directorys_unreadable_config_is_refused_not_guessed(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("[checkpoint\ndir = 1")
    with pytest.raises(RefusedError, match="cannot tell where"):
        run_checkpoint_root(tmp_path)
    (tmp_path / "config.toml").write_text("[checkpoint]\ndir = 1\n")
    with pytest.raises(RefusedError, match="not a path"):
        run_checkpoint_root(tmp_path)
    assert run_checkpoint_root(tmp_path / "none") == tmp_path / "none" / "checkpoints"  # no config: default


def test_a_rank_launched_for_another_run_directory_is_refused(tmp_path: Path) -> None:
    cfg = load_config("tiny", [f"--run.dir={tmp_path / 'a'}"])
    with pytest.raises(LaunchError, match="not the run directory this rank was launched for"):
        run_rank(cfg, Launch(run_dir=str(tmp_path / "b")))
    assert not (tmp_path / "a").exists()
