"""What a run directory must look like before truestep writes into it.

A run directory on a shared filesystem can be written by others. Every write truestep makes refuses to
follow a symlink (core/fsio.py), but a refusal halfway through a run is a crash; so a run (and the
supervisor) first checks the names it will write: each file must be absent or a regular file, each
directory absent or a real directory, and the files directly inside those directories (heartbeats,
attempt configs, TensorBoard events) regular files. A symlink among them, wherever it points, is refused
with one line naming it: it is either an attack (`metrics.jsonl -> ~/.bashrc`) or a layout truestep
does not write through (put checkpoints elsewhere with `checkpoint.dir`, not a symlinked `checkpoints/`).
The checkpoint root's own entries are the checkpoint room's to judge (checkpoint/catalog.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from truestep.core.errors import RefusedError
from truestep.core.names import CHECKPOINTS_DIR, OWN_DIRS, OWN_FILES


def _describe(path: Path, run_dir: Path, what: str) -> str:
    if path.is_symlink():
        target = os.readlink(path)
        resolved = os.path.realpath(path)
        inside = resolved == str(run_dir) or resolved.startswith(str(run_dir) + os.sep)
        where = "inside the run directory" if inside else "outside the run directory"
        return f"{path} is a symlink to {target} ({where}); truestep never writes through a symlink"
    return f"{path} is {what}, not what truestep writes there"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a file"


def run_dir_problems(run_dir: Path) -> list[str]:
    """Why truestep must not write into `run_dir` as it stands ([] when it may)."""
    run_dir = Path(run_dir)
    if not os.path.lexists(run_dir):
        return []
    if not run_dir.is_dir():
        return [f"{run_dir} exists and is not a directory"]
    real = Path(os.path.realpath(run_dir))
    problems = []
    for name in OWN_FILES:
        path = run_dir / name
        if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
            problems.append(_describe(path, real, _kind(os.lstat(path).st_mode)))
    for name in OWN_DIRS:
        path = run_dir / name
        if not os.path.lexists(path):
            continue
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            problems.append(_describe(path, real, _kind(os.lstat(path).st_mode)))
            continue
        if name == CHECKPOINTS_DIR:
            continue
        for entry in os.scandir(path):
            mode = entry.stat(follow_symlinks=False).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                problems.append(_describe(Path(entry.path), real, _kind(mode)))
    return problems


def check_run_dir(run_dir: Path) -> None:
    """RefusedError (exit 3) naming what is wrong when truestep must not write into `run_dir`."""
    problems = run_dir_problems(run_dir)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise RefusedError(
            f"refusing to use run directory {run_dir}: "
            + "; ".join(problems[:3])
            + more
            + ". Remove these entries (or use another --run.dir)"
        )
