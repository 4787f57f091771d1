"""What the supervisor sees of a rank from outside its interpreter: the kernel's view in /proc/PID/stat.

A rank's heartbeat is written by a thread of the rank itself, so it says nothing while the interpreter
cannot run that thread: while it imports torch (loading native libraries holds the GIL: phase
`loading`, allowed `startup_timeout_s` of silence), before its heartbeat has started, or when the whole
process is stopped. The kernel knows more, every poll, for every rank:

- its state: `T` (stopped, e.g. SIGSTOP) or `t` (stopped by a tracer) is a rank that cannot run at all,
  whatever its phase: declared once stopped for `liveness_timeout_s` (`process_stopped`), instead of
  the 20 s start-up allowance a rank stopped while importing torch used to get;
- its CPU time (utime + stime): a silent rank in start-up or `loading` whose CPU time does not move
  while it sleeps (state `S` or `I`; a wait for the disk, `D`, is left to the start-up deadline) is not
  importing anything, it is stuck: declared after `liveness_timeout_s` (`no_cpu_progress`);
- time it spent runnable but waiting for a CPU (state `R`, its CPU time growing slower than the clock)
  is an overloaded machine's, not the rank's: the start-up and loading deadlines do not count it, so a
  rank waiting for a template still importing on a loaded machine is not declared for those imports
  (it was, after 40 s at load 13 on 2 cores).

Where there is no /proc (not Linux) or the file cannot be read, nothing here says anything and the
heartbeat rules stand alone (docs/resilience.md). Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

STOPPED = frozenset("Tt")
"""States of a process that cannot run (stopped by a signal, or by a tracer)."""
RUNNABLE = "R"
ASLEEP = frozenset("SI")
"""States of a process waiting for nothing the kernel is doing for it (not the disk: `D`)."""
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


@dataclass(frozen=True)
class ProcSample:
    state: str
    """One letter: R running or runnable, S sleeping, D disk wait, T stopped, t traced, Z zombie, ..."""
    cpu_s: float
    """User + system CPU time of the whole process so far."""


def sample(pid: int) -> ProcSample | None:
    """The process's state and CPU time from /proc/PID/stat; None without /proc, or once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    # "pid (comm) state ppid ... utime stime ...": comm may hold spaces and parentheses.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return ProcSample(fields[0], (int(fields[11]) + int(fields[12])) * TICK_S)
    except (IndexError, ValueError):
        return None


@dataclass
class _Track:
    """One process, as the watcher's polls saw it."""

    last: ProcSample
    at: float
    stopped_since: float | None = None
    idle_since: float | None = None
    """Since when it has been seen asleep (not runnable) with its CPU time standing still."""
    starved: list[tuple[float, float]] = field(default_factory=list)
    """(end, seconds) of poll intervals it spent runnable without getting a CPU, the latest first kept."""


MAX_STARVED = 10000
"""Poll intervals of starvation remembered per process (the oldest are dropped: deadlines are shorter)."""


class OutsideView:
    """Per-process tracks, updated by `observe` once per watcher poll."""

    def __init__(self) -> None:
        self.tracks: dict[int, _Track] = {}

    def observe(self, pid: int, now: float) -> _Track | None:
        seen = sample(pid)
        if seen is None:
            self.tracks.pop(pid, None)
            return None
        track = self.tracks.get(pid)
        if track is None:
            track = self.tracks[pid] = _Track(seen, now)
        else:
            dt, dcpu = now - track.at, seen.cpu_s - track.last.cpu_s
            if seen.state == RUNNABLE and track.last.state == RUNNABLE and dt > dcpu:
                track.starved.append((now, dt - max(0.0, dcpu)))
                del track.starved[:-MAX_STARVED]
            if dcpu > 0 or seen.state not in ASLEEP:
                track.idle_since = None
            elif track.idle_since is None:
                track.idle_since = track.at  # still since the previous poll at least
            track.last, track.at = seen, now
        if seen.state in STOPPED:
            track.stopped_since = track.stopped_since if track.stopped_since is not None else now
        else:
            track.stopped_since = None
        return track

    def starved_s(self, pid: int, since: float) -> float:
        """Seconds since `since` the process was runnable and waiting for a CPU (0 where unknown)."""
        track = self.tracks.get(pid)
        if track is None:
            return 0.0
        return sum(seconds for end, seconds in track.starved if end > since)
