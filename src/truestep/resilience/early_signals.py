"""Honour preemption signals and Ctrl-C from the first instant of a rank's life (forked ones included).

A signal that arrives while a rank's interpreter starts, while torch imports or while the model is
built would otherwise kill it with the default action (seen under SLURM: a USR1 nine seconds into an
attempt; and a supervisor forwarding a preemption notice to the ranks it has just restarted, whose
graceful save was then lost). Two halves close that window:
- `held_for_child()`: the supervisor starts every rank and warm template with these signals *blocked*
  (a child inherits the signal mask of the thread that forks it, across exec), so a signal sent before
  the child installs a handler stays pending in the kernel instead of running the default action;
- `capture()`: the rank's first act (cli/main.py, before any heavy import) installs handlers that only
  record the signal, then unblocks them, so a pending one is recorded at once. The warm template never
  captures: it keeps them blocked, and each rank it forks inherits the mask (not what is pending: a
  notice sent to the template is nobody's, it is not a rank) and captures as its first act.
`SignalWatcher` (resilience/signals.py) adopts what was recorded once the config says which signals
mean preemption, and re-delivers any other with its default action. Standard library only.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

EARLY_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")
pending: list[tuple[str, float]] = []
_SIGNUMS = frozenset(signal.Signals[name] for name in EARLY_SIGNALS)


def _record(signum: int, frame: object) -> None:
    pending.append((signal.Signals(signum).name, time.time()))


def capture() -> None:
    """Record these signals from now on, and take delivery of any that waited while they were blocked."""
    for signum in _SIGNUMS:
        signal.signal(signum, _record)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNUMS)


@contextlib.contextmanager
def held_for_child() -> Iterator[None]:
    """Block these signals in the calling thread while it starts a rank or template (`subprocess.Popen`
    inside the block): the child starts with them blocked, so none it receives before `capture()` can
    kill it. This thread's own signals wait (pending) for the block's end, a few milliseconds."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNUMS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
