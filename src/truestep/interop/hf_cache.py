"""Where Hugging Face models live: `import-hf` accepts a model directory, a cache's
`models--org--name` folder, or a repo id looked up in the cache (offline: nothing is downloaded).

A cache folder holds `snapshots/<commit>/` (files linking into `blobs/`) and `refs/<branch>` (a commit
hash). The snapshot is `--revision` (a branch or tag in `refs/`, or a commit), else the one
`refs/main` names, else the only one, else the newest by modification time, said in the note returned;
two equally new ones are ambiguous and refused. Every name read from the cache is checked to be a plain
file name, and `refs/*` files are read bounded, without following links. A snapshot is a directory of
the cache itself: one that is a symlink leading out of the repository's folder is refused, never
followed (the files inside a snapshot may link into the repository's `blobs/`: hf_import's rule).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from truestep.core.fsio import OversizeFileError, UnsafePathError, plain_file_name, read_regular
from truestep.interop.errors import InteropError

CONFIG = "config.json"
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
COMMIT = re.compile(r"[0-9a-f]{40}")


def default_cache_root() -> Path:
    """The cache the `huggingface_hub` library uses: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/..."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def resolve_model_dir(
    source: str | Path, revision: str | None = None, cache_dir: Path | None = None
) -> tuple[Path, str | None]:
    """(the model directory to import, a note saying which snapshot was picked, or None)."""
    path = Path(source)
    if os.path.lexists(path / CONFIG):
        if revision is not None:
            raise InteropError(f"{path} is a model directory: --revision applies to a Hugging Face cache")
        return path, None
    if (path / "snapshots").is_dir():
        return pick_snapshot(path, revision)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("models--*"))[:5]
        hint = (
            f"it looks like a Hugging Face cache ({', '.join(found)}): give a repo id with --cache-dir {path}"
            if found
            else "give a model directory, a models--org--name folder or a repo id"
        )
        raise InteropError(f"{path}: no {CONFIG}; {hint}")
    text = str(source)
    if REPO_ID.fullmatch(text) and ".." not in text:
        root = cache_dir if cache_dir is not None else default_cache_root()
        folder = root / repo_folder(text)
        if not (folder / "snapshots").is_dir():
            raise InteropError(
                f"{text} is not in the Hugging Face cache {root} (no {folder.name}/snapshots); nothing is "
                "downloaded: fetch it first (huggingface-cli download) or give its directory"
            )
        return pick_snapshot(folder, revision)
    raise InteropError(f"{path}: no such directory, and not a repo id (org/name) in a Hugging Face cache")


def _ref(folder: Path, name: str) -> str | None:
    path = folder / "refs" / name
    if not os.path.lexists(path):
        return None
    try:
        text = read_regular(path, 4096, follow_symlinks=False).decode("ascii", "replace").strip()
    except (OSError, UnsafePathError, OversizeFileError) as err:
        raise InteropError(f"{path}: unreadable ref: {err}") from None
    if not COMMIT.fullmatch(text):
        raise InteropError(f"{path}: not a commit hash: {text[:60]!r}")
    return text


def pick_snapshot(folder: Path, revision: str | None) -> tuple[Path, str | None]:
    path, note = _pick(folder, revision)
    if os.path.islink(path):
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(Path(os.path.realpath(folder))):
            raise InteropError(
                f"{path} is a symlink to {real}, outside the cache folder {folder}: refusing to follow it"
            )
    return path, note


def _pick(folder: Path, revision: str | None) -> tuple[Path, str | None]:
    snapshots = folder / "snapshots"
    names = sorted(p.name for p in snapshots.iterdir() if p.is_dir() and plain_file_name(p.name))
    if not names:
        raise InteropError(f"{folder}: no snapshot in {snapshots}")
    if revision is not None:
        if not plain_file_name(revision):
            raise InteropError(f"--revision {revision!r}: not a branch, tag or commit name")
        commit = _ref(folder, revision) or revision
        if commit not in names:
            raise InteropError(
                f"{folder}: no snapshot for revision {revision!r} (snapshots: {', '.join(names[:5])})"
            )
        return snapshots / commit, f"revision {revision}: snapshot {commit}"
    main = _ref(folder, "main")
    if main is not None and main in names:
        return snapshots / main, f"refs/main: snapshot {main}"
    if len(names) == 1:
        return snapshots / names[0], f"the only snapshot: {names[0]}"
    times = {name: (snapshots / name).stat().st_mtime for name in names}
    newest = max(times.values())
    best = [name for name, t in times.items() if t == newest]
    if len(best) > 1:
        raise InteropError(
            f"{folder}: {len(names)} snapshots and none is the newest or named by refs/main "
            f"({', '.join(names[:5])}): choose one with --revision"
        )
    others = ", ".join(n for n in names if n != best[0])
    return snapshots / best[
        0
    ], f"the newest of {len(names)} snapshots: {best[0]} (also: {others}; --revision picks)"
