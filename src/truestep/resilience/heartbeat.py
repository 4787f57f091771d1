"""Per-rank heartbeats for the supervisor: liveness (a timestamp a thread refreshes on its own
schedule, so it keeps beating while the loop is inside a long collective or a restore) and progress (the
step and phase the training loop last reported, so a rank alive but stuck is visible too).

The heartbeat starts as early as a rank knows who it is, before torch is imported, so a rank that stops
while importing or meeting its peers is caught by the supervisor's start-up deadline rather than never.
Its thread also re-checks the run directory lease every few seconds: a rank whose attempt no longer owns
the directory (an orphan, a partitioned node) exits with code FENCED instead of writing on.

File: <run.dir>/heartbeats/rankNNNNN.json = {pid, rank, attempt, time, step, phase, longest_step_s},
replaced atomically (longest_step_s: the longest step this process has completed; optional to a reader).
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from truestep.core.control_files import ControlFileError, read_control_json, require
from truestep.core.errors import ExitCode, FencedError
from truestep.core.fsio import make_dir, replace_in_own_dir
from truestep.core.names import heartbeat_path
from truestep.core.say import say
from truestep.core.status import RankStatus

FENCE_CHECK_S = 2.0
"""How often the heartbeat thread re-reads the lease (a few reads per rank and minute)."""


_BEAT_TYPES: dict[str, type | tuple[type, ...]] = {
    "pid": int,
    "rank": int,
    "attempt": int,
    "time": (int, float),
    "step": int,
    "phase": str,
}
"""Every field a heartbeat has, with its type (a beat without one is not a heartbeat)."""


def read_heartbeat(path: Path) -> dict[str, Any] | None:
    """The last complete heartbeat, or None if none was written yet or the file is not one: a FIFO, a
    symlink, an oversized or malformed file, a field missing or mistyped (through the bounded, no-follow
    control-file reader, so a planted file never blocks or crashes the supervisor). A rank whose file is
    never a heartbeat meets the start-up or liveness deadline like a silent one."""
    try:
        beat = read_control_json(path)
        if beat is None:
            return None
        for key, kind in _BEAT_TYPES.items():
            require(beat, path, key, kind)
    except ControlFileError:
        return None
    return beat


STOP_WAIT_S = 5.0
"""How long `stop` waits for a beat being written."""


class Heartbeat:
    """Writes this rank's heartbeat every `interval_s` from a daemon thread until `stop` (the rank
    returned) or the process exits."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        attempt: int,
        status: RankStatus,
        interval_s: float,
        fence: Callable[[], None] | None = None,
    ) -> None:
        self.path = heartbeat_path(run_dir, rank)
        self.rank = rank
        self.attempt = attempt
        self.status = status
        self.interval_s = interval_s
        self.fence = fence
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._writing = threading.Lock()
        """One beat at a time, each built from the status at its write: the last one in the file is the newest."""

    def stop(self) -> None:
        """No more beats; returns once the thread has ended (a beat being written finishes first), or
        after STOP_WAIT_S when a write hangs (a hung filesystem must not keep a rank from exiting: the
        daemon thread ends with the process)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)

    def start(self) -> None:
        make_dir(self.path.parent)
        self._write()  # the first beat before returning: start-up is visible at once
        self._thread = threading.Thread(target=self._beat, name="truestep-heartbeat", daemon=True)
        self._thread.start()

    def beat_now(self) -> None:
        """Write a beat at once, from the caller's thread: for a phase change that must not wait up to one
        interval to be seen (leaving `loading`, whose longer silence allowance must not outlive it). A
        failed write is a missed beat, as on the thread."""
        with contextlib.suppress(OSError):  # e.g. a full disk: the thread's next beat says it again
            self._write()

    def _write(self) -> None:
        with self._writing:
            record = {
                "pid": os.getpid(),
                "rank": self.rank,
                "attempt": self.attempt,
                "time": time.time(),
                "step": self.status.step,
                "phase": str(self.status.phase),
                "longest_step_s": self.status.longest_step_s,
            }
            # Never through a heartbeats/ swapped for a link mid-run: that beat is missed instead, the
            # supervisor finds the rank silent, and its run directory check refuses the next attempt.
            replace_in_own_dir(self.path, json.dumps(record).encode())

    def _beat(self) -> None:
        fenced_at = time.monotonic()
        while not self._stopped.wait(self.interval_s):
            if self.fence is not None and time.monotonic() - fenced_at >= FENCE_CHECK_S:
                fenced_at = time.monotonic()
                try:
                    self.fence()
                except FencedError as err:
                    say(f"truestep train: rank {self.rank}: {err}")
                    os._exit(ExitCode.FENCED)
            try:
                self._write()
            except OSError:  # e.g. a full disk: this beat is missed, which is what a watcher's liveness
                continue  # timeout is for; the training thread meets the same disk and says so itself
