"""Config: validation, TOML round trip, fingerprint, CLI."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from config_cases import PRESETS, _write
from truestep.cli.main import main as cli_main
from truestep.config import (
    ConfigError,
    JobConfig,
    load_config,
    to_toml,
    validate_layout,
)
from truestep.config.fingerprint import diff_keys, fingerprint, trajectory_keys
from truestep.config.load import preset_names

# --------------------------------------------------------------------------- validation


def test_heads_not_divisible_by_tp():
    with pytest.raises(ConfigError, match=r"parallel.tp=3 must divide model.n_heads=4"):
        load_config("tiny", ["--parallel.tp=3"])
    # tiny has 4 query heads but 2 KV heads: tp=4 divides the former only.
    with pytest.raises(ConfigError, match=r"model.n_kv_heads=2"):
        load_config("tiny", ["--parallel.tp=4"])


def test_seq_len_exceeds_max_seq_len():
    with pytest.raises(
        ConfigError, match=r"data.seq_len=512 exceeds model.max_seq_len=256; raise max_seq_len"
    ):
        load_config("tiny", ["--data.seq_len=512"])
    assert load_config("tiny", ["--data.seq_len=256"]).data.seq_len == 256


@pytest.mark.parametrize(
    "override,message",
    [
        ("--model.dim=130", "divisible by model.n_heads"),
        ("--model.n_kv_heads=3", "multiple of model.n_kv_heads"),
        ("--model.dim=0", "model.dim must be positive"),
        ("--model.dropout=1.0", "model.dropout"),
        ("--schedule.kind=linear", "schedule.kind"),
        ("--parallel.backend=mpi", "parallel.backend"),
        ("--schedule.warmup_steps=51", "train.max_steps=50"),
        ("--train.emulate_nondeterminism=-1e-3", "train.emulate_nondeterminism must be a relative scale"),
        ("--train.emulate_nondeterminism=nan", "train.emulate_nondeterminism=nan must be a finite number"),
        ("--train.emulate_restore_error=0.5", "train.emulate_restore_error must be a relative scale"),
        ("--resilience.hang_step_multiple=-1", "resilience.hang_step_multiple=-1.0 must be a finite number"),
        ("--resilience.hang_step_multiple=inf", "resilience.hang_step_multiple=inf must be a finite number"),
    ],
)
def test_world_independent_rules(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("tiny", [override])


def test_validate_layout_ok():
    cfg = load_config("tiny", ["--parallel.tp=2"])
    assert validate_layout(cfg, 4) == (2, 2)
    assert validate_layout(load_config("tiny"), 1) == (1, 1)
    assert validate_layout(load_config("tiny", ["--parallel.dp_shard=2", "--parallel.tp=2"]), 4) == (2, 2)
    assert validate_layout(load_config("tiny", ["--train.micro_batch_size=2"]), 2) == (2, 1)


def test_validate_layout_world_not_divisible_by_tp():
    cfg = load_config("tiny", ["--parallel.tp=2"])
    with pytest.raises(ConfigError) as err:
        validate_layout(cfg, 3)
    message = str(err.value)
    assert "world size 3 is not divisible by parallel.tp=2" in message
    assert "launch a multiple of 2 processes or change parallel.tp" in message


def test_validate_layout_dp_times_tp_mismatch():
    cfg = load_config("tiny", ["--parallel.tp=2", "--parallel.dp_shard=3"])
    with pytest.raises(ConfigError) as err:
        validate_layout(cfg, 4)
    message = str(err.value)
    assert "parallel.dp_shard=3 x parallel.tp=2 = 6 != world size 4" in message
    assert "parallel.dp_shard=-1" in message


@pytest.mark.parametrize(
    "overrides,world,micro,dp",
    [
        (["--train.micro_batch_size=3"], 2, 3, 2),  # 8 % (3*2) != 0
        ([], 3, 2, 3),  # micro inferred as 8 // 3 = 2, 8 % 6 != 0
    ],
)
def test_validate_layout_batch_not_divisible(overrides, world, micro, dp):
    cfg = load_config("tiny", overrides)
    with pytest.raises(ConfigError) as err:
        validate_layout(cfg, world)
    assert f"train.global_batch_size=8 must be a multiple of micro_batch_size ({micro}) x dp ({dp})" in str(
        err.value
    )


def test_validate_layout_batch_smaller_than_dp():
    with pytest.raises(ConfigError, match="train.global_batch_size=8"):
        validate_layout(load_config("tiny"), 16)


# --------------------------------------------------------------------------- TOML round trip


@pytest.mark.parametrize("name", PRESETS)
def test_to_toml_round_trip_presets(tmp_path, name):
    cfg = load_config(name)
    assert load_config(_write(tmp_path, to_toml(cfg))) == cfg


def test_to_toml_round_trip_every_field_changed(tmp_path):
    cfg = load_config(
        "tiny",
        [
            '--run.name=say "hi" \\ to C:\\path and ünïcode',
            "--run.dir=runs/x y",
            "--model.norm_eps=1e-06",
            "--model.tie_embeddings=true",
            "--optim.lr=0.00012345678901234567",
            "--schedule.kind=wsd",
            "--schedule.decay_steps=7",
            "--checkpoint.atomic_commit=false",
            "--parallel.init_timeout_s=12.5",
        ],
    )
    text = to_toml(cfg)
    # Every section and every field is written, so nothing silently falls back to a default.
    table = tomllib.loads(text)
    assert table == dataclasses.asdict(cfg)
    back = load_config(_write(tmp_path, text))
    assert back == cfg
    assert back.run.name == cfg.run.name and back.optim.lr == cfg.optim.lr


def test_to_toml_round_trip_control_characters(tmp_path):
    cfg = load_config("tiny", ["--run.name=line1\nline2\ttab"])
    assert load_config(_write(tmp_path, to_toml(cfg))) == cfg


# --------------------------------------------------------------------------- fingerprint


def _fp(overrides: list[str]) -> str:
    return fingerprint(trajectory_keys(load_config("tiny", overrides)))


def test_fingerprint_is_stable():
    a = _fp([])
    assert a == _fp([])
    assert len(a) == 16 and int(a, 16) >= 0
    keys = trajectory_keys(load_config("tiny"))
    reordered = dict(reversed(list(keys.items())))
    assert list(reordered) != list(keys)
    assert fingerprint(reordered) == a


@pytest.mark.parametrize(
    "override",
    [
        "--model.dim=256",
        "--train.seed=1",
        "--data.data_seed=99",
        "--train.global_batch_size=16",
        "--train.max_steps=60",
        "--optim.lr=0.002",
        "--schedule.kind=constant",
        # With dropout (or plain fp32 accumulation order) the micro-batch shapes the trajectory.
        "--train.micro_batch_size=2",
        "--train.emulate_nondeterminism=1e-3",
    ],
)
def test_fingerprint_changes_with_trajectory_keys(override):
    assert _fp([override]) != _fp([])


@pytest.mark.parametrize(
    "override",
    [
        "--parallel.tp=2",
        "--parallel.dp_shard=2",
        "--run.dir=elsewhere",
        "--checkpoint.interval=3",
        "--train.stop_at_step=5",
        "--metrics.log_every=10",
        "--train.emulate_restore_error=1e-3",
        "--resilience.hang_step_multiple=0",
    ],
)
def test_fingerprint_ignores_layout_and_bookkeeping(override):
    assert _fp([override]) == _fp([])


def test_diff_keys_names_the_changed_key():
    saved = trajectory_keys(load_config("tiny"))
    current = trajectory_keys(load_config("tiny", ["--model.dim=256", "--parallel.tp=2"]))
    assert diff_keys(saved, current) == ["model.dim: 128 -> 256"]
    assert diff_keys(saved, saved) == []
    assert diff_keys({"a.b": 1}, {}) == ["a.b: 1 -> '<absent>'"]


def test_diff_keys_reads_a_key_the_checkpoint_predates_as_its_default():
    current = trajectory_keys(load_config("tiny"))
    saved = {k: v for k, v in current.items() if k != "model.head_dim"}  # saved before head_dim existed
    assert diff_keys(saved, current) == []
    changed = trajectory_keys(load_config("tiny", ["--model.head_dim=16"]))
    assert diff_keys(saved, changed) == ["model.head_dim: 0 -> 16"]


def test_trajectory_keys_sections():
    keys = trajectory_keys(JobConfig())
    assert "model.dim" in keys and "data.data_seed" in keys and "train.seed" in keys
    assert not any(k.startswith(("parallel.", "run.", "checkpoint.", "metrics.")) for k in keys)
    assert "train.stop_at_step" not in keys


# --------------------------------------------------------------------------- CLI


def test_cli_config_prints_resolved_toml(capsys):
    assert cli_main(["config", "tiny", "--model.dim=64", "--run.name=cli"]) == 0
    out = capsys.readouterr().out
    table = tomllib.loads(out)
    assert table["model"]["dim"] == 64
    assert table["model"]["n_layers"] == 2  # from the preset
    assert table["run"]["name"] == "cli"
    assert table == dataclasses.asdict(load_config("tiny", ["--model.dim=64", "--run.name=cli"]))


def test_cli_config_without_spec_uses_defaults(capsys):
    assert cli_main(["config", "--train.seed=7"]) == 0
    table = tomllib.loads(capsys.readouterr().out)
    expected = dataclasses.asdict(JobConfig())
    expected["train"]["seed"] = 7
    assert table == expected


def test_cli_presets(capsys):
    """Each preset once, with its size (issue 41: names alone said nothing about what they cost)."""
    assert cli_main(["presets"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert list(lines) == preset_names()
    assert set(PRESETS) <= set(lines)
    assert "   1.24B parameters  (dim 2048, 16 layers, 32 heads (8 kv), vocab 128256)" in lines["llama3.2-1b"]
    assert " 8.03B parameters" in lines["llama3-8b"] and " 70.55B parameters" in lines["70b"]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["config", "tiny", "--model.dim=abc"], "model.dim"),
        (["config", "no-such-preset"], "neither a file nor a preset"),
        (["config", "tiny", "--data.seq_len=4096"], "raise max_seq_len"),
    ],
)
def test_cli_config_error_exit_code_2(capsys, argv, needle):
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "truestep config: config error:" in captured.err
    assert needle in captured.err


def test_cli_unknown_command(capsys):
    assert cli_main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
