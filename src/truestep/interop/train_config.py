"""The ready-to-train config `import-hf` writes beside the weights it imported (`<out>/train.toml`):
the model section that reproduces the imported model's shape and numerics, and `checkpoint.init_from`
pointing at the import, so `truestep train <out>/train.toml --data.path=...` fine-tunes it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from truestep.config.load import _toml_value
from truestep.config.schema import ModelConfig
from truestep.core.fsio import atomic_write

TRAIN_CONFIG = "train.toml"


def write_train_config(out: Path, model: ModelConfig, source: str) -> Path:
    """Write `<out>/train.toml` and return its path. `init_from` is absolute: a config is read from
    wherever `truestep train` runs, not from where the file lies."""
    lines = [
        f"# Written by `truestep import-hf` from {source}: fine-tune it with",
        f"#   truestep train {out / TRAIN_CONFIG} --data.path=DIR --run.dir=runs/NAME",
        "# (prepare DIR with `truestep prepare-data ... --tokenizer` this model's tokenizer.json).",
        "# Every other key has its default: see `truestep config --reference`.",
        "",
        "[model]",
    ]
    for field in dataclasses.fields(ModelConfig):
        lines.append(f"{field.name} = {_toml_value(getattr(model, field.name))}")
    lines += ["", "[checkpoint]", f"init_from = {_toml_value(str(Path(out).resolve()))}", ""]
    path = Path(out) / TRAIN_CONFIG
    atomic_write(path, "\n".join(lines).encode())
    return path
