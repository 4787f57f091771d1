"""Catch preemption signals and Ctrl-C from the first moment of a rank's life.

A signal that arrives while torch is still importing or the model is being built would otherwise kill
the rank with the default action (seen under SLURM: a USR1 nine seconds into an attempt) or print a
KeyboardInterrupt traceback. `capture()` runs before any heavy import and only records the signal;
`SignalWatcher` adopts it once the config says which signals mean preemption, and re-delivers any other
with its default action.
"""

from __future__ import annotations

import signal
import time

EARLY_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")
pending: list[tuple[str, float]] = []


def _record(signum: int, frame: object) -> None:
    pending.append((signal.Signals(signum).name, time.time()))


def capture() -> None:
    for name in EARLY_SIGNALS:
        signal.signal(signal.Signals[name], _record)
