"""Config: schema docstrings, presets, TOML + override parsing."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest

from config_cases import PRESETS, _write
from truestep.config import (
    ConfigError,
    load_config,
    validate,
    validate_layout,
)
from truestep.config import schema as schema_module
from truestep.config.load import preset_names

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
