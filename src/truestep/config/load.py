"""Load a JobConfig from TOML plus `--section.key=value` overrides, with strict type checks."""

from __future__ import annotations

import dataclasses
import os
import sys
import tomllib
import typing
from importlib import resources
from pathlib import Path
from typing import Any

from truestep.config.errors import ConfigError
from truestep.config.fit import fit_schedule, overridden_keys
from truestep.config.schema import JobConfig
from truestep.config.validate import validate
from truestep.core.fsio import read_regular

PRESET_PACKAGE = "truestep.presets"
CONFIG_LIMIT = 1 << 20
"""A config file is a few KiB; one over 1 MiB is refused unread."""


def preset_names() -> list[str]:
    files = resources.files(PRESET_PACKAGE).iterdir()
    return sorted(f.name[: -len(".toml")] for f in files if f.name.endswith(".toml"))


def read_toml(spec: str) -> tuple[dict[str, Any], str]:
    """Read a config file path or a preset name; returns (table, source description)."""
    path = Path(spec)
    if path.exists():
        text, source = read_config_text(path, follow_symlinks=True), str(path)
    elif spec in preset_names():
        text = resources.files(PRESET_PACKAGE).joinpath(f"{spec}.toml").read_text()
        source = f"preset:{spec}"
    else:
        raise ConfigError(
            f"config {spec!r} is neither a file nor a preset; presets: {', '.join(preset_names())}"
        )
    return parse_toml(text, source), source


def read_config_text(path: Path, follow_symlinks: bool = False) -> str:
    """A config file's text through the bounded reader: a FIFO, device, directory or a file over
    CONFIG_LIMIT bytes is a one-line ConfigError (never a blocking or unbounded read)."""
    try:
        data = read_regular(path, CONFIG_LIMIT, follow_symlinks=follow_symlinks)
        return data.decode("utf-8")
    except (OSError, ValueError) as err:  # UnsafePathError, OversizeFileError, UnicodeDecodeError
        reason = err.strerror if isinstance(err, OSError) and err.strerror else " ".join(str(err).split())
        raise ConfigError(f"config {path}: {reason}") from None


def parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source}: invalid TOML: {err}") from err


def _field_types(section_obj: Any) -> dict[str, type]:
    return {f.name: type(getattr(section_obj, f.name)) for f in dataclasses.fields(section_obj)}


def _item_type(obj: Any, key: str) -> Any:
    """The element dataclass of a `list[X]` field (e.g. data.sources), else None."""
    hint = typing.get_type_hints(type(obj)).get(key)
    args = typing.get_args(hint)
    return args[0] if typing.get_origin(hint) is list and args else None


def _coerce_list(value: Any, item_type: Any, source: str, dotted: str) -> list[Any]:
    """A TOML array of tables as a list of `item_type` dataclasses, each key checked like a section's."""
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ConfigError(
            f"{source}: {dotted}: expected an array of tables like [{{key = value}}, ...], got {value!r}"
        )
    items = []
    for index, table in enumerate(value):
        item = item_type()
        coerce_table(item, table, source, f"{dotted}[{index}]")
        items.append(item)
    return items


def _coerce(value: Any, want: type, where: str) -> Any:
    """Check a TOML value against the field's type; ints are accepted for floats, nothing else."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if want is bool and isinstance(value, bool):
        return value
    if want is int and is_number and isinstance(value, int):
        return value
    if want is float and is_number:
        return float(value)
    if want is str and isinstance(value, str):
        return value
    raise ConfigError(f"{where}: expected {want.__name__}, got {type(value).__name__} {value!r}")


def _parse_cli_value(text: str, want: type, where: str) -> Any:
    if want is str:
        return text
    if want is bool:
        lowered = text.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected true/false, got {text!r}")
    try:
        return want(text)
    except ValueError as err:
        raise ConfigError(f"{where}: expected {want.__name__}, got {text!r}") from err


def apply_table(cfg: JobConfig, table: dict[str, Any], source: str) -> None:
    sections = {f.name for f in dataclasses.fields(cfg)}
    for section, values in table.items():
        if section not in sections:
            raise ConfigError(f"{source}: unknown section [{section}]; known: {', '.join(sorted(sections))}")
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        coerce_table(getattr(cfg, section), values, source, section)


def coerce_table(obj: Any, values: dict[str, Any], source: str, section: str) -> None:
    """Set the fields of one section object from a table of values, each checked against its type
    (ConfigError naming `source` and `section.key` for an unknown key or a wrong type)."""
    types = _field_types(obj)
    for key, value in values.items():
        if key not in types:
            raise ConfigError(f"{source}: unknown key {section}.{key}; known: {', '.join(sorted(types))}")
        item_type = _item_type(obj, key)
        if item_type is not None:
            setattr(obj, key, _coerce_list(value, item_type, source, f"{section}.{key}"))
        else:
            setattr(obj, key, _coerce(value, types[key], f"{source}: {section}.{key}"))


def apply_overrides(cfg: JobConfig, overrides: list[str]) -> None:
    """Apply `--section.key=value` (or `section.key=value`) strings."""
    for raw in overrides:
        item = raw[2:] if raw.startswith("--") else raw
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"override {raw!r} must look like --section.key=value")
        dotted, text = item.split("=", 1)
        section, key = dotted.split(".", 1)
        if not hasattr(cfg, section) or not dataclasses.is_dataclass(getattr(cfg, section)):
            known = ", ".join(sorted(f.name for f in dataclasses.fields(cfg)))
            raise ConfigError(f"override {raw!r}: unknown section {section!r}; known: {known}")
        obj = getattr(cfg, section)
        types = _field_types(obj)
        if key not in types:
            raise ConfigError(f"override {raw!r}: unknown key {dotted}; known: {', '.join(sorted(types))}")
        item_type = _item_type(obj, key)
        if item_type is not None:
            # A list of tables is written as a TOML inline array: --data.sources='[{path="a", weight=1}]'.
            try:
                value = tomllib.loads(f"value = {text}")["value"]
            except tomllib.TOMLDecodeError as err:
                raise ConfigError(f"override {dotted}: not a TOML array of inline tables: {err}") from err
            setattr(obj, key, _coerce_list(value, item_type, "override", dotted))
            continue
        setattr(obj, key, _parse_cli_value(text, types[key], f"override {dotted}"))


def load_config(spec: str | None, overrides: list[str] | None = None) -> JobConfig:
    """Defaults <- TOML file or preset (if given) <- overrides. Validates world-independent rules."""
    table, source = read_toml(spec) if spec else ({}, "defaults")
    return config_from_table(table, source, overrides)


def config_from_table(table: dict[str, Any], source: str, overrides: list[str] | None = None) -> JobConfig:
    """Defaults <- `table` (parsed TOML from `source`) <- overrides, validated."""
    cfg = JobConfig()
    apply_table(cfg, table, source)
    apply_overrides(cfg, overrides or [])
    note = fit_schedule(cfg, overridden_keys(overrides or []))
    if note is not None and os.environ.get("RANK", "0") == "0":  # torchrun: every rank loads the config
        print(f"truestep: {note}", file=sys.stderr, flush=True)
    validate(cfg)
    return cfg


def to_dict(cfg: JobConfig) -> dict[str, dict[str, Any]]:
    return dataclasses.asdict(cfg)


_TOML_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_string(value: str) -> str:
    out = []
    for ch in value:
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {_toml_value(item)}" for key, item in value.items()) + "}"
    return repr(value)


def to_toml(cfg: JobConfig) -> str:
    lines: list[str] = []
    for section, values in to_dict(cfg).items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)
