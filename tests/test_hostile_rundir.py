"""Hostile run directories and careless input (issue 12, classes 1, 6 and 7): writes never follow a
symlink, a run directory whose own files are symlinks (or FIFOs) is refused before anything is written,
config values that cannot be meant are refused, and every expected error is one line with a documented
exit code.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from hostile_cases import mkfifo, one_line, run_cli, within
from truestep.core.errors import NO_REQUEUE, ExitCode, expected_failure
from truestep.core.fsio import (
    OversizeFileError,
    UnsafePathError,
    atomic_write,
    open_append,
    open_for_write,
    read_regular,
    sha256_file,
    write_new_file,
)
from truestep.core.rundir import run_dir_problems

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- fsio


def test_writes_never_follow_a_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for name in ("replace", "append", "write", "new"):
        os.symlink(victim, tmp_path / name)
    atomic_write(tmp_path / "replace", b"x")  # the link is replaced, never its target
    assert not (tmp_path / "replace").is_symlink() and (tmp_path / "replace").read_bytes() == b"x"
    with pytest.raises(UnsafePathError, match="symlink"):
        open_append(tmp_path / "append")
    with pytest.raises(UnsafePathError, match="symlink"):
        open_for_write(tmp_path / "write")
    with pytest.raises(Exception, match="already exists; refusing to overwrite it"):
        write_new_file(tmp_path / "new", lambda f: f.write(b"x"))
    assert victim.read_bytes() == b"precious"


def test_a_fifo_blocks_no_reader_and_no_writer(tmp_path):
    fifo = mkfifo(tmp_path / "fifo")
    for call in (
        lambda: read_regular(fifo, 100),
        lambda: sha256_file(fifo),
        lambda: open_append(fifo),
        lambda: open_for_write(fifo),
        lambda: read_regular(fifo, 100, follow_symlinks=True),
    ):
        with pytest.raises(UnsafePathError):
            within(10, call)


def test_read_regular_bounds_the_size(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(OversizeFileError, match="more than the 100"):
        read_regular(big, 100)
    assert read_regular(big, 101) == b"x" * 101


def test_write_new_file_is_all_or_nothing(tmp_path):
    target = tmp_path / "out.bin"

    def fail(f):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        write_new_file(target, fail)
    assert not target.exists() and list(tmp_path.iterdir()) == []
    write_new_file(target, lambda f: f.write(b"whole"))
    assert target.read_bytes() == b"whole"


# ---------------------------------------------------------------------------------------------- run dir


def plant(run: Path) -> Path:
    """A run directory whose metrics.jsonl is a symlink to a file outside it."""
    run.mkdir(parents=True)
    victim = run.parent / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, run / "metrics.jsonl")
    return victim


@pytest.mark.parametrize(
    "entry,make,why",
    [
        ("metrics.jsonl", "symlink-outside", "metrics.jsonl is a symlink to"),
        ("config.toml", "symlink-inside", "(inside the run directory)"),
        ("events.jsonl", "fifo", "events.jsonl is a FIFO"),
        ("heartbeats", "symlink-outside", "heartbeats is a symlink to"),
        ("heartbeats/rank00000.json", "symlink-outside", "rank00000.json is a symlink to"),
        ("checkpoints", "symlink-outside", "checkpoints is a symlink to"),
        ("lease.json", "directory", "lease.json is a directory"),
    ],
)
def test_run_dir_problems_name_the_entry(entry, make, why, tmp_path):
    run = tmp_path / "run"
    (run / "heartbeats").mkdir(parents=True)
    (run / "notes.txt").write_text("inside")
    path = run / entry
    if path.is_dir():
        path.rmdir()
    if make == "symlink-outside":
        os.symlink(tmp_path, path)
    elif make == "symlink-inside":
        os.symlink(run / "notes.txt", path)
    elif make == "fifo":
        mkfifo(path)
    else:
        path.mkdir()
    (problem,) = run_dir_problems(run)
    assert why in problem, problem


@pytest.mark.multiprocess
def test_train_refuses_a_run_directory_with_a_symlinked_log(tmp_path):
    """`metrics.jsonl -> ../victim.txt`: refused before anything is written (exit 3, one line); the
    target is untouched and the run directory holds nothing new."""
    run = tmp_path / "run"
    victim = plant(run)
    proc = harness.launch(run, "--train.max_steps=6", check=False)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert f"{run}/metrics.jsonl is a symlink to {victim} (outside the run directory)" in one_line(
        proc.stderr
    )
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


@pytest.mark.multiprocess
def test_debug_prints_the_traceback_as_well(tmp_path):
    run = tmp_path / "run"
    plant(run)
    args = ["--debug", "train", "tiny", f"--run.dir={run}", *harness.TINY, "--train.max_steps=6"]
    proc = subprocess.run(
        [sys.executable, "-m", "truestep", *args], env=harness.truestep_env(), capture_output=True, text=True
    )
    assert proc.returncode == 3
    assert "Traceback (most recent call last)" in proc.stderr and "RefusedError" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith("truestep train: refusing to use run directory")


@pytest.mark.multiprocess
def test_launch_refuses_it_before_the_supervisor_writes(tmp_path):
    run = tmp_path / "run"
    victim = plant(run)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "truestep",
            "launch",
            "tiny",
            "--nproc",
            "1",
            f"--run.dir={run}",
            *harness.TINY,
        ],
        env=harness.truestep_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "metrics.jsonl is a symlink to" in one_line(proc.stderr)
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


# ---------------------------------------------------------------------------------------------- config


def config_error(*overrides: str) -> str:
    from truestep.cli.main import main

    rc, out, err = run_cli(main, "config", "tiny", *overrides)
    assert rc == 2, (out, err)
    return one_line(err)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "override,why",
    [
        ("--optim.lr=inf", "optim.lr=inf must be a finite number"),
        ("--optim.lr=nan", "optim.lr=nan must be a finite number"),
        ("--optim.eps=-inf", "optim.eps=-inf must be a finite number"),
        ("--model.rope_theta=0", "model.rope_theta must be positive"),
        ("--model.rope_theta=-10000", "model.rope_theta must be positive"),
        ("--model.norm_eps=inf", "model.norm_eps=inf must be a finite number"),
        ("--model.init_std=nan", "model.init_std=nan must be a finite number"),
        ("--model.max_seq_len=1000000000000", "model.max_seq_len=1000000000000 is beyond 1048576"),
        ("--model.ffn_dim_multiplier=1e9", "model.ffn_dim_multiplier must be in [0, 64]"),
        ("--run.dir=", "run.dir must not be empty"),
        ("--run.dir=   ", "run.dir must not be empty"),
        ("--train.seed=-1", "train.seed and data.data_seed must be >= 0"),
        ("--train.seed=100000000000000000000", "train.seed=100000000000000000000 does not fit in 64 bits"),
        ("--train.grad_clip=nan", "train.grad_clip=nan must be a finite number"),
        ("--schedule.min_lr_ratio=nan", "schedule.min_lr_ratio=nan must be a finite number"),
        ("--resilience.hang_timeout_s=inf", "resilience.hang_timeout_s=inf must be a finite number"),
        ("--resilience.requeue_exit_code=3", "resilience.requeue_exit_code=3 must be in [1, 254]"),
        ("--resilience.requeue_exit_code=129", "neither it nor it + 1"),
        ("--resilience.exit_deadline_s=-1", "must be positive"),
        ("--parallel.init_timeout_s=0", "parallel.init_timeout_s must be positive"),
        ("--metrics.log_every=0", "metrics.log_every must be >= 1"),
        ("--train.stop_at_step=-3", "train.stop_at_step must be >= 0"),
    ],
)
def test_values_that_cannot_be_meant_are_refused(override, why):
    assert why in config_error(override)


@pytest.mark.multiprocess
def test_lr_inf_never_trains(tmp_path):
    """`--optim.lr=inf` ran to completion and committed a non-finite checkpoint: now exit 2 at once."""
    run = tmp_path / "run"
    proc = harness.launch(run, "--optim.lr=inf", "--train.max_steps=6", check=False)
    assert proc.returncode == 2
    assert "optim.lr=inf must be a finite number" in one_line(proc.stderr)
    assert not run.exists()


@pytest.mark.multiprocess
def test_cuda_without_cuda_is_a_config_error_not_a_traceback(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = harness.launch(tmp_path / "run", "--parallel.device=cuda", "--train.max_steps=6", check=False)
    assert proc.returncode == 2
    assert "parallel.device=cuda but CUDA is not available" in one_line(proc.stderr)


# ---------------------------------------------------------------------------------------------- errors


def test_expected_failure_names_a_full_disk_and_where():
    full = OSError(errno.ENOSPC, "No space left on device", "/ckpt/step_00000006/__0_0.distcp")
    wrapped = RuntimeError("committing a checkpoint failed")
    wrapped.__cause__ = full
    for err in (full, wrapped):
        code, line = expected_failure(err)
        assert code == ExitCode.STORAGE == 6
        assert line == "no space left on device: /ckpt/step_00000006/__0_0.distcp"
    assert expected_failure(OSError(errno.EIO, "Input/output error", "/x"))[0] == ExitCode.FAILURE
    assert expected_failure(ValueError("a bug")) is None


@pytest.mark.multiprocess
def test_report_prints_one_line_and_only_on_rank_0(monkeypatch):
    from truestep.cli.main import main

    monkeypatch.setenv("RANK", "1")
    rc, out, err = run_cli(main, "train", "tiny", "--optim.lr=inf")
    assert rc == 2 and err == ""  # every rank of a torchrun job loads the same config: rank 0 says it
    monkeypatch.setenv("RANK", "0")
    rc, out, err = run_cli(main, "train", "tiny", "--optim.lr=inf")
    assert rc == 2 and "optim.lr=inf" in one_line(err)


def test_every_exit_code_is_documented_and_the_sbatch_default_is_in_step():
    table = (REPO / "docs" / "resilience.md").read_text()
    for code in ExitCode:
        assert re.search(rf"^\| {int(code)} \|", table, re.M), (
            f"exit code {int(code)} missing from docs/resilience.md"
        )
    sbatch = (REPO / "scripts" / "slurm" / "train.sbatch").read_text()
    default = re.search(r"TRUESTEP_NO_REQUEUE_CODES:-([0-9 ]+)\}", sbatch).group(1).split()
    assert [int(c) for c in default] == [int(c) for c in NO_REQUEUE]
