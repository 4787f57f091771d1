"""What the supervisor hands a rank cannot be swapped (issue 27, item 3): the rank loads the attempt
config only if its bytes hash to the SHA-256 in its launch record."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from harness import TINY
from truestep.cli.train import train_main
from truestep.config.attempt import AttemptConfigSwapped, load_attempt_config
from truestep.config.errors import ConfigError
from truestep.config.load import load_config, to_toml
from truestep.core.launch import Launch, LaunchError


def _written(tmp_path: Path) -> tuple[Path, str]:
    """An attempt config as the supervisor writes it, and the hash it hands over."""
    blob = to_toml(load_config("tiny", [f"--run.dir={tmp_path / 'run'}", *TINY])).encode()
    path = tmp_path / "attempt00000-node0.toml"
    path.write_bytes(blob)
    return path, hashlib.sha256(blob).hexdigest()


def _swap_checkpoint_dir(path: Path, elsewhere: Path) -> None:
    text = path.read_text().replace('dir = ""', f'dir = "{elsewhere}"', 1)
    assert str(elsewhere) in text
    path.write_text(text)


def test_the_written_config_loads(tmp_path: Path) -> None:
    path, sha = _written(tmp_path)
    assert load_attempt_config(path, sha).run.dir == str(tmp_path / "run")


def test_a_swapped_attempt_config_is_refused(tmp_path: Path) -> None:
    path, sha = _written(tmp_path)
    _swap_checkpoint_dir(path, tmp_path / "other-run" / "checkpoints")
    with pytest.raises(AttemptConfigSwapped, match="not the file the supervisor wrote") as err:
        load_attempt_config(path, sha)
    assert err.value.exit_code == 3 and "\n" not in str(err.value)


def test_a_symlinked_attempt_config_is_refused(tmp_path: Path) -> None:
    path, sha = _written(tmp_path)
    target = tmp_path / "elsewhere.toml"
    path.rename(target)
    path.symlink_to(target)  # same bytes, but the name is not the file the supervisor wrote
    with pytest.raises(ConfigError, match="symlink"):
        load_attempt_config(path, sha)


def test_a_supervised_rank_refuses_a_swapped_config_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, sha = _written(tmp_path)
    _swap_checkpoint_dir(path, tmp_path / "other-run" / "checkpoints")
    rank = Launch(supervisor_pid=os.getpid(), job="j", attempt=0, config_file=str(path), config_sha256=sha)
    for name, value in rank.to_env().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(AttemptConfigSwapped):
        train_main([])
    assert not (tmp_path / "run").exists()


def test_the_hash_travels_in_the_launch_record_and_is_required(tmp_path: Path) -> None:
    path, sha = _written(tmp_path)
    rank = Launch(supervisor_pid=1, job="j", attempt=2, config_file=str(path), config_sha256=sha)
    assert Launch.from_env(rank.to_env()) == rank
    with pytest.raises(LaunchError, match="TRUESTEP_CONFIG_SHA256"):
        Launch.from_env({**rank.to_env(), "TRUESTEP_CONFIG_SHA256": ""})
    with pytest.raises(LaunchError, match="not a SHA-256"):
        Launch.from_env({**rank.to_env(), "TRUESTEP_CONFIG_SHA256": "xyz"})
