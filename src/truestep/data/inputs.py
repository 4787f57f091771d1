"""What `prepare-data` reads: files, directories and globs, expanded into an ordered list of inputs.

Formats by name: `.jsonl`, `.jsonl.gz`, `.jsonl.zst` (one JSON object per line), `.parquet`, a directory
written by `datasets`' `save_to_disk` (its Arrow files, read with pyarrow), and `.txt` (one document per
file). A file named explicitly with any other name is one plain-text document, as before; a directory is
walked recursively in sorted order for the formats above (hidden entries skipped). The order of the list
is the order of the token stream.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path

from truestep.data.errors import DataUsageError as InputError

TEXT, JSONL, JSONL_GZ, JSONL_ZST, PARQUET, HF_DATASET = (
    "text",
    "jsonl",
    "jsonl.gz",
    "jsonl.zst",
    "parquet",
    "hf-dataset",
)
SUFFIXES = {
    ".jsonl.gz": JSONL_GZ,
    ".jsonl.zst": JSONL_ZST,
    ".jsonl": JSONL,
    ".parquet": PARQUET,
    ".txt": TEXT,
}
COMPRESSED = (".gz", ".zst", ".zstd", ".bz2", ".xz", ".lz4", ".zip")
HF_STATE = "state.json"
HF_DICT = "dataset_dict.json"


@dataclass(frozen=True)
class InputFile:
    """One input of the stream: a file, or a save_to_disk directory and its Arrow files."""

    path: Path
    kind: str
    size: int
    """Bytes on disk (all Arrow files for a dataset): the unit of the progress bar and its ETA."""
    parts: tuple[Path, ...] = ()
    """A dataset's Arrow files, in their recorded order."""

    def identity(self) -> dict[str, object]:
        """What a resumed prepare-data must find unchanged (name, format, size, modification time)."""
        files = self.parts or (self.path,)
        return {
            "path": str(self.path),
            "format": self.kind,
            "bytes": self.size,
            "mtime_ns": [f.stat().st_mtime_ns for f in files],
        }


def kind_of(path: Path, explicit: bool) -> str | None:
    """The format of a file by its name; an explicitly named file of another name is plain text."""
    name = path.name.lower()
    for suffix, kind in SUFFIXES.items():
        if name.endswith(suffix):
            return kind
    if not explicit:
        return None
    if name.endswith(COMPRESSED):
        raise InputError(
            f"{path}: compressed input of an unsupported kind; prepare-data reads .jsonl.gz and .jsonl.zst "
            "(decompress other files first)"
        )
    return TEXT


def _dataset_parts(directory: Path) -> tuple[Path, ...]:
    """The Arrow files a save_to_disk directory's state.json lists; only bare names inside it."""
    state_path = directory / HF_STATE
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{state_path}: not a readable `datasets` save_to_disk state ({e})") from e
    parts = []
    for name in names:
        if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
            raise InputError(f"{state_path}: data file {name!r} is not a plain file name in {directory}")
        part = directory / name
        if part.is_symlink() or not part.is_file():
            raise InputError(f"{state_path} lists {name}, which is missing (or a symlink) in {directory}")
        parts.append(part)
    if not parts:
        raise InputError(f"{state_path} lists no data files")
    return tuple(parts)


def _directory(directory: Path) -> list[InputFile]:
    if (directory / HF_DICT).is_file():
        splits = sorted(p.name for p in directory.iterdir() if (p / HF_STATE).is_file())
        raise InputError(
            f"{directory} is a `datasets` DatasetDict; name one split directory, e.g. "
            + ", ".join(str(directory / s) for s in splits[:3])
        )
    if (directory / HF_STATE).is_file():
        parts = _dataset_parts(directory)
        return [InputFile(directory, HF_DATASET, sum(p.stat().st_size for p in parts), parts)]
    found: list[InputFile] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        here = Path(root)
        if here != directory and (here / HF_STATE).is_file():
            dirs[:] = []
            found += _directory(here)
            continue
        for name in sorted(files):
            path = here / name
            kind = None if name.startswith(".") else kind_of(path, explicit=False)
            if kind is not None and path.is_file():
                found.append(InputFile(path, kind, path.stat().st_size))
    if not found:
        raise InputError(
            f"{directory} holds no input prepare-data reads ({', '.join(SUFFIXES)} or a save_to_disk dataset)"
        )
    return found


def _one(path: Path) -> list[InputFile]:
    if path.is_dir():
        return _directory(path)
    if not path.is_file():
        raise InputError(f"input file not found (or not a regular file): {path}")
    if not os.access(path, os.R_OK):
        raise InputError(f"input file is not readable: {path}")
    kind = kind_of(path, explicit=True)
    assert kind is not None
    return [InputFile(path, kind, path.stat().st_size)]


def expand_inputs(specs: list[Path] | list[str]) -> list[InputFile]:
    """Files, directories and globs (`*`, `?`, `[`, `**`), in the order given; each glob sorted."""
    if not specs:
        raise InputError("no input files given")
    found: list[InputFile] = []
    for spec in specs:
        text = str(spec)
        if not Path(text).exists() and any(ch in text for ch in "*?["):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise InputError(f"no input matches {text}")
            for match in matches:
                found += _one(Path(match))
        else:
            found += _one(Path(text))
    seen: set[Path] = set()
    for item in found:
        key = item.path.resolve()
        if key in seen:
            raise InputError(f"input {item.path} is named more than once (a glob or directory overlaps)")
        seen.add(key)
    return found
