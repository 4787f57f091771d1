"""Helpers for the hostile-input tests (tests/test_hostile_*.py): crafting checkpoints around one real
one, the way an attacker who can write the directory would, and running code that must neither raise
nor hang on them.

A crafted checkpoint is *recommitted* (manifest and marker rewritten to match), so what is tested is
the check that looks past the manifest, not the hash that any edit breaks.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt_cases import ckpt
from truestep.checkpoint.catalog import MANIFEST, MARKER, QUARANTINE, step_dir_name, step_of
from truestep.checkpoint.integrity import verification_problem
from truestep.checkpoint.resolver import CheckpointNotFound, find_verified, pick_resume
from truestep.checkpoint.safe_dcp import safe_load_metadata
from truestep.cli.ckpt import ckpt_main
from truestep.config.schema import CheckpointConfig
from truestep.telemetry.run_logs import RunLogs

SHARD = "__0_0.distcp"
METADATA = ".metadata"
RANK0 = "rank00000.json"


def copy_step(src: Path, dest_root: Path, step: int | None = None) -> Path:
    """A private copy of checkpoint `src` as `dest_root/step_XXXXXXXX` (its own step unless given)."""
    dest = dest_root / step_dir_name(step if step is not None else step_of(src) or 0)
    dest_root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dest)
    return dest


def recommit(ckpt_dir: Path, step: int | None = None, files: dict[str, dict[str, Any]] | None = None) -> None:
    """Rewrite manifest and marker consistently, as anyone who can write the directory can. `files`
    replaces the manifest's file table (for entries our own manifest writer would refuse to list)."""
    from truestep.checkpoint.manifest import build_manifest, write_marker
    from truestep.core.fsio import sha256_file

    step = step_of(ckpt_dir) if step is None else step
    assert step is not None
    if files is None:
        manifest = build_manifest(ckpt_dir, step)
    else:
        per_item = any(isinstance(entry, dict) and "items" in entry for entry in files.values())
        sharded = any(isinstance(entry, dict) and "shard" in entry for entry in files.values())
        manifest = {
            "format": "truestep-manifest",
            "version": 3 if sharded else 2 if per_item else 1,
            "step": step,
            "files": files,
        }
    blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
    (ckpt_dir / MANIFEST).unlink(missing_ok=True)
    (ckpt_dir / MANIFEST).write_bytes(blob)
    write_marker(ckpt_dir, step, blob)
    assert sha256_file(ckpt_dir / MANIFEST)  # the manifest itself stays a regular file


def listing(ckpt_dir: Path, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """A manifest file table for the regular files of ckpt_dir (names in `skip` left out)."""
    from truestep.core.fsio import sha256_file

    out = {}
    for path in sorted(ckpt_dir.iterdir()):
        if path.name in (MANIFEST, MARKER, *skip) or not path.is_file() or path.is_symlink():
            continue
        out[path.name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return out


def edit_metadata(ckpt_dir: Path, edit: Callable[[Any], Any]) -> None:
    """Apply `edit` to the unpickled DCP metadata (its return value, if not None, replaces it), write
    it back with plain pickle and recommit."""
    metadata = safe_load_metadata((ckpt_dir / METADATA).read_bytes())
    result = edit(metadata)
    (ckpt_dir / METADATA).write_bytes(pickle.dumps(metadata if result is None else result))
    recommit(ckpt_dir)


def edit_rank_state(ckpt_dir: Path, edit: Callable[[dict[str, Any]], None], rank: int = 0) -> None:
    path = ckpt_dir / f"rank{rank:05d}.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    recommit(ckpt_dir)


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn()'s result, or AssertionError if it has not returned within `seconds` (a FIFO opened for
    reading blocks forever: the thread is a daemon, so a hang fails the test instead of the run)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # handed to the caller below
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"did not return within {seconds} s (blocked on a FIFO?)"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def run_cli(main: Callable[[list[str]], int], *argv: object) -> tuple[int, str, str]:
    """A CLI entry point in process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def one_line(stderr: str) -> str:
    """The single line an expected error prints (asserts there is exactly one and no traceback)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    return lines[0]


def mkfifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def crafted_root(reference: Path, tmp_path: Path) -> Path:
    """A checkpoint root holding copies of the reference's steps 3 and 6 (6 is the one to craft)."""
    root = tmp_path / "checkpoints"
    for step in (3, 6):
        copy_step(ckpt(reference, step), root)
    return root


def six(root: Path) -> Path:
    return root / step_dir_name(6)


def judged_everywhere(root: Path, why: str) -> None:
    """Step 6 fails verification with `why` everywhere it is looked at, and resume falls back to 3."""
    d = six(root)
    problem = within(30, lambda: verification_problem(d, checksums=True))
    assert problem is not None and why in problem, problem
    with pytest.raises(CheckpointNotFound, match="does not verify"):
        find_verified(d, checksums=True)
    rc, out, err = within(30, lambda: run_cli(ckpt_main, "verify", d))
    assert rc == 1 and why in one_line(err), err
    for action in ("inspect", "list"):
        rc, out, err = within(
            30, lambda action=action: run_cli(ckpt_main, action, d if action == "inspect" else root)
        )
        assert rc == 0 and err == "", err
    logs = RunLogs(root.parent, attempt=0, enabled=True)
    try:
        assert within(30, lambda: pick_resume(root, CheckpointConfig(), logs)) == 3
    finally:
        logs.close()
    (moved,) = (root / QUARANTINE).iterdir()
    assert moved.name.startswith("step_00000006.")


def tensor_entry(metadata: Any, fqn: str = "model.tok_embeddings.weight") -> Any:
    """The DCP metadata entry of one tensor (to craft its declared properties or chunks)."""
    return metadata.state_dict_metadata[fqn]
