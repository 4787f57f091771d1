"""The environment a run inherits is an input too (issue 27, item 5): fault injection from
TRUESTEP_FAULTS only when asked for, a banner and `run_start` listing what is armed, every TRUESTEP_*
value validated in one line, and a demo cache that others can write is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import INPROCESS_JOB, TINY, events
from truestep.cli.launch import launch_main
from truestep.cli.train import train_main
from truestep.config.load import load_config
from truestep.core.launch import Launch, LaunchError
from truestep.data.demo import ensure_demo_data
from truestep.data.errors import DataError
from truestep.faults.optin import EnvFaultsRefused, faults_to_arm
from truestep.faults.spec import FaultSpecError, parse_faults
from truestep.train.rank import run_rank

FAULT = "kill:rank=0:step=3"


def test_env_faults_without_opt_in_are_refused_in_one_line() -> None:
    with pytest.raises(EnvFaultsRefused, match="--allow-env-faults") as err:
        faults_to_arm(Launch(faults=FAULT), [], allowed=False, prog="truestep train")
    assert "\n" not in str(err.value)


def test_env_faults_with_opt_in_are_armed_with_a_banner(capsys: pytest.CaptureFixture[str]) -> None:
    armed = faults_to_arm(Launch(faults=FAULT), ["nan:step=5"], allowed=True, prog="truestep train")
    assert [s.text for s in parse_faults(armed.faults)] == [FAULT, "nan:step=5"]
    assert f"FAULT INJECTION ARMED: {FAULT}; nan:step=5" in capsys.readouterr().err


def test_cli_faults_need_no_opt_in_but_are_announced(capsys: pytest.CaptureFixture[str]) -> None:
    armed = faults_to_arm(Launch(), [FAULT], allowed=False, prog="truestep launch")
    assert armed.faults == FAULT
    assert "FAULT INJECTION ARMED" in capsys.readouterr().err


def test_a_supervised_ranks_faults_come_from_its_supervisor(capsys: pytest.CaptureFixture[str]) -> None:
    rank = Launch(faults=FAULT, supervisor_pid=os.getpid(), job="j", attempt=0)
    assert faults_to_arm(rank, [], allowed=False, prog="truestep train").faults == FAULT
    assert capsys.readouterr().err == ""  # the supervisor printed the banner once for the job


@pytest.mark.parametrize("main", [train_main, launch_main])
def test_train_and_launch_refuse_inherited_faults(
    main: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRUESTEP_FAULTS", "corrupt:step=2")
    with pytest.raises(EnvFaultsRefused):
        main([f"--run.dir={tmp_path}", *TINY])  # type: ignore[operator]
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_the_config_switch_is_the_opt_in_too(tmp_path: Path) -> None:
    cfg = load_config("tiny", [f"--run.dir={tmp_path}", "--run.allow_env_faults=true"])
    assert cfg.run.allow_env_faults
    assert not load_config("tiny").run.allow_env_faults


def test_run_start_lists_the_armed_faults(tmp_path: Path) -> None:
    cfg = load_config("tiny", [f"--run.dir={tmp_path}", *TINY, *INPROCESS_JOB, "--train.max_steps=2"])
    fault = "sleep:at=train:step:step=1:seconds=0"
    assert run_rank(cfg, Launch(faults=fault)) == 0
    assert events(tmp_path, "run_start")[0]["faults"] == [fault]


@pytest.mark.parametrize(
    "env",
    [
        {"TRUESTEP_JOB_START": "abc"},
        {"TRUESTEP_JOB_START": "inf"},
        {"TRUESTEP_JOB_START": "nan"},
        {"TRUESTEP_DEBUG": "yes"},
        {"TRUESTEP_ATTEMPT": "two"},
    ],
)
def test_malformed_truestep_values_are_one_line_errors(env: dict[str, str]) -> None:
    with pytest.raises(LaunchError) as err:
        Launch.from_env(env)
    name = next(iter(env))
    assert str(err.value).startswith(f"{name}=") and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "spec", ["slow:rank=0:factor=inf", "slow:factor=nan", "kill:time=inf", "sleep:at=startup:seconds=inf"]
)
def test_fault_numbers_must_be_finite(spec: str) -> None:
    with pytest.raises(FaultSpecError, match="finite"):
        parse_faults(spec)


def test_a_cache_relative_path_is_refused() -> None:
    from truestep.core.launch import cache_root

    with pytest.raises(LaunchError, match="TRUESTEP_CACHE"):
        cache_root({"TRUESTEP_CACHE": "relative/cache"})


def test_a_demo_cache_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone may plant a corpus here
    with pytest.raises(DataError, match="other users"):
        ensure_demo_data(shared / "demo")
    assert not (shared / "demo").exists()
    shared.chmod(0o755)
    planted = shared / "demo"
    planted.mkdir()
    planted.chmod(0o757)
    with pytest.raises(DataError, match="other users"):
        ensure_demo_data(planted)
