"""Config: schema docstrings, presets, TOML + override parsing, validation, round trip, fingerprint, CLI."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import tomllib
from pathlib import Path

import pytest

from truestep.cli.main import main as cli_main
from truestep.config import (
    ConfigError,
    JobConfig,
    load_config,
    to_toml,
    validate,
    validate_layout,
)
from truestep.config import schema as schema_module
from truestep.config.fingerprint import diff_keys, fingerprint, trajectory_keys
from truestep.config.load import preset_names

PRESETS = ["tiny", "small", "llama3-8b", "13b", "70b"]


def _write(tmp_path: Path, text: str, name: str = "job.toml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# --------------------------------------------------------------------------- schema docstrings


def _is_dataclass_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        return target.id == "dataclass"
    return isinstance(target, ast.Attribute) and target.attr == "dataclass"


def _field_docs(source: str) -> dict[str, dict[str, str | None]]:
    """{class: {field: docstring or None}} for every dataclass in `source`."""
    out: dict[str, dict[str, str | None]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        if not any(_is_dataclass_decorator(d) for d in node.decorator_list):
            continue
        fields: dict[str, str | None] = {}
        body = node.body
        for i, stmt in enumerate(body):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            nxt = body[i + 1] if i + 1 < len(body) else None
            doc = None
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                doc = nxt.value.value
            fields[stmt.target.id] = doc
        out[node.name] = fields
    return out


def _undocumented(source: str) -> list[str]:
    return [
        f"{cls}.{name}"
        for cls, fields in _field_docs(source).items()
        for name, doc in fields.items()
        if doc is None or not doc.strip()
    ]


def test_docstring_checker_detects_missing_docstrings():
    source = '''
from dataclasses import dataclass
import dataclasses

@dataclass
class A:
    good: int = 1
    """Documented."""
    bare: int = 2
    also_bare: int = 3
    after_number: int = 4
    5
    blank: str = ""
    """   """

@dataclasses.dataclass(frozen=True)
class B:
    last: int = 0

class NotADataclass:
    ignored: int = 0
'''
    assert _undocumented(source) == ["A.bare", "A.also_bare", "A.after_number", "A.blank", "B.last"]
    assert set(_field_docs(source)) == {"A", "B"}


def test_every_schema_field_has_a_docstring():
    docs = _field_docs(inspect.getsource(schema_module))
    # The parser must see exactly the dataclasses and fields that exist at runtime.
    runtime = {
        name: [f.name for f in dataclasses.fields(obj)]
        for name, obj in vars(schema_module).items()
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__module__ == schema_module.__name__
    }
    assert "JobConfig" in runtime and "ModelConfig" in runtime
    assert {cls: list(fields) for cls, fields in docs.items()} == runtime
    assert _undocumented(inspect.getsource(schema_module)) == []


# --------------------------------------------------------------------------- presets


def test_preset_names_lists_every_preset():
    assert set(PRESETS) <= set(preset_names())
    assert preset_names() == sorted(preset_names())


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_and_validates(name):
    cfg = load_config(name)
    validate(cfg)
    assert cfg.data.seq_len <= cfg.model.max_seq_len
    # Every preset has a comment line at the top saying what it is.
    from importlib import resources

    text = resources.files("truestep.presets").joinpath(f"{name}.toml").read_text()
    assert text.startswith("# ") and len(text.splitlines()[0]) > 10


def test_big_presets_have_llama_shapes_and_long_context():
    m8 = load_config("llama3-8b").model
    assert (m8.dim, m8.n_layers, m8.n_heads, m8.n_kv_heads, m8.vocab_size) == (4096, 32, 32, 8, 128256)
    assert (m8.multiple_of, m8.ffn_dim_multiplier, m8.rope_theta, m8.norm_eps) == (1024, 1.3, 500000.0, 1e-5)
    m13 = load_config("13b").model
    assert (m13.dim, m13.n_layers, m13.n_heads, m13.n_kv_heads, m13.multiple_of) == (5120, 40, 40, 8, 256)
    assert m13.ffn_dim_multiplier == 0.0
    m70 = load_config("70b").model
    assert (m70.dim, m70.n_layers, m70.n_heads, m70.n_kv_heads, m70.multiple_of) == (8192, 80, 64, 8, 4096)
    for name in ("llama3-8b", "13b", "70b"):
        cfg = load_config(name)
        assert cfg.model.max_seq_len == 8192 and cfg.data.seq_len == 8192
        assert cfg.model.rope_theta == 500000.0 and cfg.model.vocab_size == 128256
    # The 70B preset's TP degree works on an 8-GPU node, and with several nodes.
    assert validate_layout(load_config("70b"), 8) == (1, 8)
    assert validate_layout(load_config("70b"), 64) == (8, 8)


def test_unknown_config_spec_lists_presets():
    with pytest.raises(ConfigError, match="neither a file nor a preset") as err:
        load_config("no-such-preset")
    assert "tiny" in str(err.value) and "llama3-8b" in str(err.value)


# --------------------------------------------------------------------------- overrides


def test_overrides_parse_each_type():
    cfg = load_config(
        "tiny",
        [
            "--model.dim=64",
            "--optim.lr=0.002",
            "--optim.weight_decay=0",  # an int spelling for a float field
            "--train.deterministic=false",
            "--metrics.progress=0",
            "--checkpoint.resume=YES",
            "run.name=a=b c",  # without the leading dashes; '=' inside the value is kept
            "--run.dir=/tmp/x",
        ],
    )
    assert cfg.model.dim == 64 and type(cfg.model.dim) is int
    assert cfg.optim.lr == 0.002
    assert cfg.optim.weight_decay == 0.0 and type(cfg.optim.weight_decay) is float
    assert cfg.train.deterministic is False
    assert cfg.metrics.progress is False
    assert cfg.checkpoint.resume is True
    assert cfg.run.name == "a=b c"
    assert cfg.run.dir == "/tmp/x"


@pytest.mark.parametrize("text,expected", [("true", True), ("on", True), ("1", True), ("Off", False)])
def test_bool_override_spellings(text, expected):
    assert load_config("tiny", [f"--train.deterministic={text}"]).train.deterministic is expected


@pytest.mark.parametrize(
    "override,key",
    [
        ("--train.deterministic=maybe", "train.deterministic"),
        ("--model.dim=6.5", "model.dim"),
        ("--model.dim=abc", "model.dim"),
        ("--optim.lr=fast", "optim.lr"),
    ],
)
def test_bad_override_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", [override])
    assert key in str(err.value)
    assert override.split("=", 1)[1] in str(err.value)


def test_override_unknown_key_lists_known_keys():
    with pytest.raises(ConfigError, match="unknown key model.width") as err:
        load_config("tiny", ["--model.width=3"])
    message = str(err.value)
    assert "dim" in message and "n_layers" in message and "rope_theta" in message


def test_override_unknown_section_is_rejected():
    with pytest.raises(ConfigError, match="unknown section 'bogus'"):
        load_config("tiny", ["--bogus.x=1"])


def test_override_unknown_section_lists_known_sections():
    with pytest.raises(ConfigError) as err:
        load_config("tiny", ["--bogus.x=1"])
    assert "model" in str(err.value) and "checkpoint" in str(err.value)


@pytest.mark.parametrize("override", ["--model.dim", "--dim=64", "model=3"])
def test_malformed_override_is_rejected(override):
    with pytest.raises(ConfigError, match="--section.key=value"):
        load_config("tiny", [override])


def test_override_wins_over_toml(tmp_path):
    path = _write(tmp_path, "[model]\ndim = 64\n")
    assert load_config(path).model.dim == 64
    assert load_config(path, ["--model.dim=32"]).model.dim == 32


# --------------------------------------------------------------------------- TOML parsing


def test_toml_unknown_section_lists_known_sections(tmp_path):
    path = _write(tmp_path, "[modle]\ndim = 64\n")
    with pytest.raises(ConfigError, match=r"unknown section \[modle\]") as err:
        load_config(path)
    assert "model" in str(err.value) and "schedule" in str(err.value)
    assert path in str(err.value)


def test_toml_unknown_key_lists_known_keys(tmp_path):
    path = _write(tmp_path, "[train]\nsteps = 5\n")
    with pytest.raises(ConfigError, match="unknown key train.steps") as err:
        load_config(path)
    assert "max_steps" in str(err.value) and "global_batch_size" in str(err.value)


def test_toml_section_must_be_a_table(tmp_path):
    with pytest.raises(ConfigError, match=r"\[model\] must be a table"):
        load_config(_write(tmp_path, "model = 3\n"))


@pytest.mark.parametrize(
    "body,key,expected",
    [
        ('[model]\ndim = "64"', "model.dim", "expected int"),
        ("[model]\ndim = 64.0", "model.dim", "expected int"),
        ("[model]\ndim = true", "model.dim", "expected int"),
        ("[model]\ntie_embeddings = 1", "model.tie_embeddings", "expected bool"),
        ('[model]\ntie_embeddings = "true"', "model.tie_embeddings", "expected bool"),
        ("[optim]\nlr = true", "optim.lr", "expected float"),
        ('[optim]\nlr = "3e-4"', "optim.lr", "expected float"),
        ("[run]\nname = 5", "run.name", "expected str"),
        ("[train]\nseed = [1, 2]", "train.seed", "expected int"),
    ],
)
def test_toml_wrong_types_are_rejected(tmp_path, body, key, expected):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, body + "\n"))
    assert key in str(err.value) and expected in str(err.value)


def test_toml_int_is_accepted_for_float(tmp_path):
    cfg = load_config(_write(tmp_path, "[optim]\nlr = 1\nweight_decay = 0\n"))
    assert cfg.optim.lr == 1.0 and type(cfg.optim.lr) is float
    assert cfg.optim.weight_decay == 0.0 and type(cfg.optim.weight_decay) is float


def test_invalid_toml_syntax(tmp_path):
    path = _write(tmp_path, "[model\ndim = 64\n")
    with pytest.raises(ConfigError, match="invalid TOML") as err:
        load_config(path)
    assert path in str(err.value)


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
        "--train.micro_batch_size=2",
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
    assert cli_main(["presets"]) == 0
    lines = capsys.readouterr().out.split()
    assert lines == preset_names()
    assert set(PRESETS) <= set(lines)


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
