"""What `prepare-data` reads: files, directories and globs, expanded into an ordered list of inputs.

Formats by name: `.jsonl`, `.jsonl.gz`, `.jsonl.zst` (one JSON object per line), `.parquet`, a directory
written by `datasets`' `save_to_disk` (its Arrow files, read with pyarrow), and `.txt` (one document per
file). A file named explicitly with any other name is one plain-text document, as before; a directory is
walked recursively in sorted order for the formats above (hidden entries skipped). The order of the list
is the order of the token stream.

Every input is confined to the directory it was named in: a file's own folder, a directory, a glob's
fixed part (`corpus/**/*.jsonl` -> `corpus/`). A cloned repository or an unpacked archive can carry a
symlink to anywhere (`corpus/notes.txt -> ~/.ssh/id_rsa`, a subdirectory -> `/`); an input whose real
path leaves its directory -- a file, a directory a walk or a `**` glob would enter -- is refused with its
name (exit 3), never read into the shards. A link that stays inside is fine, and readers open the real
path it resolved to (`InputFile.real`), without following links. `state.json` is read bounded.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from truestep.core.fsio import OversizeFileError, UnsafePathError, read_regular
from truestep.core.outside import OutsideJsonError, UnconfinedPathError, confined, loads_bounded
from truestep.data.errors import DataError
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
STATE_LIMIT = 16 << 20
"""A save_to_disk state.json lists its Arrow files in a few KB; a larger one is not one."""


@dataclass(frozen=True)
class InputFile:
    """One input of the stream: a file, or a save_to_disk directory and its Arrow files."""

    path: Path
    kind: str
    size: int
    """Bytes on disk (all Arrow files for a dataset): the unit of the progress bar and its ETA."""
    parts: tuple[Path, ...] = ()
    """A dataset's Arrow files, in their recorded order."""
    real: Path | None = None
    """Where `path` resolved to inside its directory (no links left): what readers open. None: `path`."""

    @property
    def source(self) -> Path:
        """The path to open: `real`, which has no symlink left in it, else `path`."""
        return self.real or self.path

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


def _inside(path: Path, root: Path) -> Path:
    """`path`'s real path when it stays inside `root`; DataError (exit 3) naming it otherwise."""
    try:
        return confined(path, root)
    except UnconfinedPathError as err:
        raise DataError(f"refusing input {err}") from None


def _dataset_parts(directory: Path) -> tuple[Path, ...]:
    """The Arrow files a save_to_disk directory's state.json lists; only bare names inside it."""
    state_path = directory / HF_STATE
    try:
        state = loads_bounded(read_regular(state_path, STATE_LIMIT), str(state_path))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, OutsideJsonError, OversizeFileError, KeyError, TypeError) as e:
        reason = e.strerror if isinstance(e, UnsafePathError) else " ".join(str(e).split())[:200]
        raise DataError(f"{state_path}: not a readable `datasets` save_to_disk state ({reason})") from None
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


def _directory(directory: Path, root: Path) -> list[InputFile]:
    if (directory / HF_DICT).is_file():
        splits = sorted(p.name for p in directory.iterdir() if (p / HF_STATE).is_file())
        raise InputError(
            f"{directory} is a `datasets` DatasetDict; name one split directory, e.g. "
            + ", ".join(str(directory / s) for s in splits[:3])
        )
    if (directory / HF_STATE).is_file():
        real = _inside(directory, root)
        parts = _dataset_parts(real)
        return [InputFile(directory, HF_DATASET, sum(p.stat().st_size for p in parts), parts, real)]
    found: list[InputFile] = []
    for here_text, dirs, files in os.walk(directory):
        here = Path(here_text)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in dirs:
            if (here / name).is_symlink():  # not entered by the walk: but one out is said, not skipped
                _inside(here / name, root)
        if here != directory and (here / HF_STATE).is_file():
            dirs[:] = []
            found += _directory(here, root)
            continue
        for name in sorted(files):
            path = here / name
            kind = None if name.startswith(".") else kind_of(path, explicit=False)
            if kind is not None and (path.is_file() or path.is_symlink()):
                real = _inside(path, root)
                found.append(InputFile(path, kind, real.stat().st_size, real=real))
    if not found:
        raise InputError(
            f"{directory} holds no input prepare-data reads ({', '.join(SUFFIXES)} or a save_to_disk dataset)"
        )
    return found


def _one(path: Path, root: Path | None = None) -> list[InputFile]:
    """The inputs of `path`, confined to `root` (a glob's fixed part; default: a directory itself, a file's
    own folder)."""
    if path.is_dir():
        return _directory(path, root or path)
    if not path.is_file():
        raise InputError(f"input file not found (or not a regular file): {path}")
    if not os.access(path, os.R_OK):
        raise InputError(f"input file is not readable: {path}")
    kind = kind_of(path, explicit=True)
    assert kind is not None
    real = _inside(path, root or path.parent)
    return [InputFile(path, kind, real.stat().st_size, real=real)]


def _fixed_part(pattern: str) -> Path:
    """The directory a glob is named in: its leading components without a wildcard."""
    fixed: list[str] = []
    for part in Path(pattern).parts[:-1]:
        if any(ch in part for ch in "*?["):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


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
            root = _fixed_part(text)
            for match in matches:
                found += _one(Path(match), root)
        else:
            found += _one(Path(text))
    seen: set[Path] = set()
    for item in found:
        key = item.source.resolve()
        if key in seen:
            raise InputError(f"input {item.path} is named more than once (a glob or directory overlaps)")
        seen.add(key)
    return found
