"""A foreign trainer's per-step observables, read from its own logs: TensorBoard scalar event files
(`tensorboard:PATH`, a file or a directory searched for event files), Hugging Face Trainer's
trainer_state.json (`hf:PATH`, the file or a directory with it or checkpoint-N/ holding it) and JSON
lines (`jsonl:PATH`).

The files are someone else's and may be half written (the job was just killed), rewritten while read
(Trainer rewrites trainer_state.json non-atomically) or hostile: every file is opened without following
a symlink and never blocking on a FIFO (core/fsio.py), read only up to a size bound, parsed without
unpickling, and what cannot be used is counted in `problems` (the report names it), never raised.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from truestep.audit.spec import OBSERVABLES, LogSpec
from truestep.audit.tfevents import read_scalars
from truestep.core.fsio import OversizeFileError, UnsafePathError, read_regular

MAX_LOG_BYTES = 256 << 20
"""One log file's bound: a per-step scalar log of millions of steps fits well under it."""
MAX_FILES = 4096
"""Event files searched under a tensorboard: directory."""
MAX_DEPTH = 6
CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"


@dataclass(frozen=True)
class Record:
    """One logged step: its observables (loss, grad_norm, lr where logged) and when it was logged
    (None where the log keeps no time: trainer_state.json, a JSON line without one)."""

    step: int
    values: tuple[tuple[str, float], ...]
    time: float | None = None

    @property
    def observed(self) -> dict[str, float]:
        return dict(self.values)


@dataclass
class LogRead:
    records: list[Record]
    problems: list[str]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _record(step: Any, found: dict[str, Any], tags: dict[str, str], time: Any = None) -> Record | None:
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    values = []
    for name in OBSERVABLES:
        value = _number(found.get(tags.get(name, ""))) if name in tags else None
        if value is not None:
            values.append((name, value))
    when = _number(time)
    return Record(step, tuple(values), when if when is not None and math.isfinite(when) else None)


def _read(path: Path, problems: list[str]) -> bytes | None:
    try:
        return read_regular(path, MAX_LOG_BYTES)
    except (OSError, UnsafePathError, OversizeFileError) as err:
        problems.append(f"{path}: not read ({err})")
        return None


def _event_files(root: Path, problems: list[str]) -> list[Path]:
    if root.is_file() or root.is_symlink():
        return [root]
    found: list[Path] = []
    for top, dirs, files in os.walk(root, followlinks=False):
        depth = len(Path(top).relative_to(root).parts)
        if depth >= MAX_DEPTH:
            dirs.clear()
        dirs.sort()
        found += [Path(top) / name for name in sorted(files) if "tfevents" in name]
        if len(found) > MAX_FILES:
            problems.append(f"{root}: more than {MAX_FILES} event files; the rest not read")
            return found[:MAX_FILES]
    return found


def read_tensorboard(root: Path, tags: dict[str, str]) -> LogRead:
    """Every step of every event file, file by file (files in name order: TensorBoard names them by
    creation time), a step's tags gathered into one record (time: the latest of their wall times)."""
    problems: list[str] = []
    records: list[Record] = []
    wanted = {tag: name for name, tag in tags.items() if name in OBSERVABLES}
    for path in _event_files(root, problems):
        data = _read(path, problems)
        if data is None:
            continue
        scalars, bad, _ = read_scalars(data)
        if bad:
            problems.append(f"{path}: {bad} record(s) did not parse")
        held: dict[int, tuple[dict[str, float], float]] = {}
        for s in scalars:
            if s.tag not in wanted:
                continue
            values, when = held.get(s.step, ({}, s.wall_time))
            if s.tag in values:  # the step logged again in this file: a new record
                records.append(_record(s.step, values, tags, when))  # type: ignore[arg-type]
                values, when = {}, s.wall_time
            values[s.tag] = s.value
            held[s.step] = (values, max(when, s.wall_time))
        records += [r for step, (v, t) in held.items() if (r := _record(step, v, tags, t)) is not None]
    return LogRead([r for r in records if r is not None], problems)


def _trainer_states(root: Path) -> list[Path]:
    if not root.is_dir():
        return [root]
    found = [root / TRAINER_STATE] if (root / TRAINER_STATE).exists() else []
    with os.scandir(root) as entries:
        dirs = [e.name for e in entries if CHECKPOINT_DIR.match(e.name) and e.is_dir(follow_symlinks=False)]
    found += [root / d / TRAINER_STATE for d in dirs if (root / d / TRAINER_STATE).exists()]
    return found


def read_hf(root: Path, tags: dict[str, str]) -> LogRead:
    """log_history of the trainer_state.json with the highest global_step (of PATH itself, or of PATH
    and its checkpoint-N/ directories): the entries that log a loss."""
    problems: list[str] = []
    best: tuple[int, list[Any]] | None = None
    for path in _trainer_states(root):
        data = _read(path, problems)
        if data is None:
            continue
        try:
            state = json.loads(data)
            step, history = state["global_step"], state["log_history"]
            if not isinstance(step, int) or not isinstance(history, list):
                raise TypeError("global_step or log_history of the wrong type")
        except (ValueError, KeyError, TypeError) as err:  # mid-rewrite, or not Trainer's
            problems.append(f"{path}: not a trainer_state.json ({err})")
            continue
        if best is None or step > best[0]:
            best = (step, history)
    records = []
    for entry in best[1] if best else []:
        if isinstance(entry, dict) and tags["loss"] in entry:
            record = _record(entry.get("step"), entry, tags)
            if record is not None:
                records.append(record)
    return LogRead(records, problems)


def read_jsonl(path: Path, tags: dict[str, str]) -> LogRead:
    """One record per JSON object line with an integer step; its time from a numeric `time` key when
    present. A torn last line (a writer killed mid-line) is left out; a corrupt line elsewhere is
    counted."""
    problems: list[str] = []
    data = _read(path, problems) if path.exists() else b""
    if data is None:
        return LogRead([], problems)
    lines = data.split(b"\n")
    records, bad = [], 0
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            if index != len(lines) - 1:  # the last piece has no newline yet: still being written
                bad += 1
            continue
        record = (
            _record(item.get(tags["step"]), item, tags, item.get("time")) if isinstance(item, dict) else None
        )
        if record is not None:
            records.append(record)
    if bad:
        problems.append(f"{path}: {bad} line(s) are not JSON")
    return LogRead(records, problems)


def read_logs(spec: LogSpec, run_dir: Path) -> LogRead:
    """The records of one run's logs as they are now (nothing there yet: none)."""
    where = spec.where(run_dir)
    if not where.exists() and not where.is_symlink():
        return LogRead([], [])
    if spec.format == "tensorboard":
        return read_tensorboard(where, spec.tags)
    if spec.format == "hf":
        return read_hf(where, spec.tags)
    return read_jsonl(where, spec.tags)
