"""What `truestep audit` is told: where the logs are (`--logs FORMAT:PATH`, `--tags`), which faults to
inject (`--fault`), and the command. Bad input is a UsageError (one line, exit 2)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from truestep.core.errors import UsageError

RUN_DIR = "{run_dir}"
"""Replaced in the command, --logs and --weights by each run's own directory."""
FORMATS = ("tensorboard", "hf", "jsonl")
DEFAULT_TAGS: dict[str, dict[str, str]] = {
    # Hugging Face Trainer's names (its TensorBoard callback prefixes train/).
    "tensorboard": {"loss": "train/loss", "grad_norm": "train/grad_norm", "lr": "train/learning_rate"},
    "hf": {"loss": "loss", "grad_norm": "grad_norm", "lr": "learning_rate"},
    "jsonl": {"loss": "loss", "grad_norm": "grad_norm", "lr": "lr", "step": "step"},
}
REQUIRED = ("loss", "grad_norm")
"""Observables every step must log: a step without them counts as not logged."""
OBSERVABLES = ("loss", "grad_norm", "lr")
FAULT = re.compile(r"^(kill|term)@(step|time)=(\d+(?:\.\d+)?)$")


@dataclass(frozen=True)
class LogSpec:
    format: str
    path: str
    """Relative to each run's directory, or containing {run_dir}."""
    tags: dict[str, str] = field(default_factory=dict)
    """Observable (loss, grad_norm, lr; step for jsonl) -> the tag or key the trainer logs it under."""

    def where(self, run_dir: Path) -> Path:
        return resolve_in(self.path, run_dir)

    @property
    def text(self) -> str:
        return f"{self.format}:{self.path}"


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    """kill (SIGKILL of the process group) or term (SIGTERM, then SIGKILL after the grace period)."""
    trigger: str
    """step (the logs show step N) or time (S seconds after the run's first launch)."""
    value: float

    @property
    def text(self) -> str:
        value = int(self.value) if self.trigger == "step" else f"{self.value:g}"
        return f"{self.kind}@{self.trigger}={value}"


def resolve_in(path: str, run_dir: Path) -> Path:
    """A --logs or --weights path for one run: {run_dir} replaced, a relative path taken under the run
    directory (every run has its own logs and weights; one shared path would compare a run with itself)."""
    if RUN_DIR in path:
        return Path(path.replace(RUN_DIR, str(run_dir)))
    return run_dir / path


def check_path(path: str, what: str) -> None:
    if not path:
        raise UsageError(f"{what}: the path is empty")
    if Path(path).is_absolute() and RUN_DIR not in path:
        raise UsageError(
            f"{what} {path!r} is absolute and names no {RUN_DIR}: every run needs its own; give a path "
            f"relative to the run's directory or one containing {RUN_DIR}"
        )


def parse_tags(text: str | None, fmt: str) -> dict[str, str]:
    tags = dict(DEFAULT_TAGS[fmt])
    known = (*OBSERVABLES, "step") if fmt == "jsonl" else OBSERVABLES
    for item in filter(None, (text or "").split(",")):
        name, sep, tag = item.partition("=")
        if not sep or not tag or name not in known:
            raise UsageError(f"--tags: {item!r} is not NAME=TAG with NAME one of {', '.join(known)}")
        tags[name] = tag
    return tags


def parse_logs(text: str, tags: str | None = None) -> LogSpec:
    fmt, sep, path = text.partition(":")
    if not sep or fmt not in FORMATS:
        raise UsageError(f"--logs {text!r}: expected FORMAT:PATH with FORMAT one of {', '.join(FORMATS)}")
    check_path(path, "--logs")
    return LogSpec(fmt, path, parse_tags(tags, fmt))


def parse_fault(text: str) -> FaultSpec:
    match = FAULT.match(text.strip())
    if not match:
        raise UsageError(f"--fault {text!r}: expected kill@step=N, term@step=N, kill@time=S or term@time=S")
    kind, trigger, value = match.groups()
    number = float(value)
    if trigger == "step" and (not number.is_integer() or number < 1):
        raise UsageError(f"--fault {text!r}: the step must be a whole number >= 1")
    return FaultSpec(kind, trigger, number)


def parse_command(command: list[str]) -> list[str]:
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command to audit: give it after --, e.g. -- python train.py --out {run_dir}")
    return command


def substitute(command: list[str], run_dir: Path) -> list[str]:
    return [part.replace(RUN_DIR, str(run_dir)) for part in command]
