"""A writer cleans what a dead writer of the same path left (core/writer_temps.py): the temp file of an
atomic write killed between its create and its rename is removed by the next process that writes that
path (the `latest` hint of a rank SIGKILLed mid-write, a heartbeat, the lease); a live writer's temp, and
one from another host, are never touched. Real processes, really killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from truestep.core.fsio import atomic_write, write_new_file
from truestep.core.writer_temps import WRITER_TAG, temp_writer

DIE_WRITING = textwrap.dedent(
    """
    import os, signal, sys, tempfile
    from pathlib import Path
    from truestep.core.writer_temps import temp_prefix
    path = Path(sys.argv[1])
    # atomic_write's first step, then a kill before its rename: what a SIGKILLed writer leaves
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.write(fd, b"half a hint")
    print(tmp, flush=True)
    if sys.argv[2] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()  # a live writer: waits until told to go
    """
)


def writer(path: Path, how: str) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", DIE_WRITING, str(path), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    tmp = Path(proc.stdout.readline().strip())
    assert tmp.is_file() and temp_writer(tmp.name, path) == (WRITER_TAG, proc.pid)
    return proc, tmp


def temps(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


def test_the_next_writer_removes_a_dead_writers_temp_and_only_that(tmp_path: Path) -> None:
    hint = tmp_path / "checkpoints" / "latest"
    hint.parent.mkdir()
    atomic_write(hint, b"step_00000010")
    dead, left = writer(hint, "die")
    assert dead.wait(30) == -signal.SIGKILL and left.exists()
    live, kept = writer(hint, "live")
    stranger = (
        hint.parent / f".latest.{'0' * 8 if WRITER_TAG != '0' * 8 else '1' * 8}-{dead.pid}.abcdefgh.tmp"
    )
    stranger.write_bytes(b"another host's writer")  # same pid, another host: not ours to judge
    try:
        # This process wrote `latest` already: its sweep was at that first write. A new writer process
        # (the next attempt's rank 0) writes it now.
        code = subprocess.run(
            [sys.executable, "-c", "import sys; from pathlib import Path; from truestep.core.fsio import "
             "atomic_write; atomic_write(Path(sys.argv[1]), b'step_00000020')", str(hint)],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            timeout=60,
        ).returncode  # fmt: skip
        assert code == 0
        assert not left.exists(), "the dead writer's temp file was left behind"
        assert kept.exists() and stranger.exists()
        assert hint.read_bytes() == b"step_00000020"
        assert temps(hint) == sorted([kept.name, stranger.name])
    finally:
        live.communicate("", timeout=30)


def test_a_new_file_writer_cleans_too(tmp_path: Path) -> None:
    out = tmp_path / "w.pt"
    dead, left = writer(out, "die")
    assert dead.wait(30) == -signal.SIGKILL
    write_new_file(out, lambda f: f.write(b"weights"))
    assert out.read_bytes() == b"weights" and not left.exists() and temps(out) == []
