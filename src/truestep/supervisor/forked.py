"""The supervisor's handle on a rank its warm template forked (supervisor/standby.py).

The template double-forks, so the rank's parent exits at once and the kernel hands the rank to the
supervisor, a child subreaper (core/parent_death.py `adopt_orphans`): the rank is the supervisor's own
child, as a fresh `subprocess.Popen` rank is. This handle gives it the part of Popen's interface the
supervisor uses (pid, poll, wait, send_signal, kill, returncode), on `waitpid` of that pid: the pid stays
the rank's until this handle reaps it, so a signal never reaches a process that reused it (as in Popen,
`send_signal` checks first).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

WAIT_POLL_S = 0.01


class ForkedRank:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        """As Popen's: the exit code, or -N for a process ended by signal N; None while it runs."""

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked rank {self.pid}", timeout or 0.0)
            time.sleep(WAIT_POLL_S)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)
