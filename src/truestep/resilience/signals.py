"""Preemption signals and Ctrl-C: caught on any rank, agreed across ranks, ending in an emergency save.

- A preemption signal (`resilience.signals`, default SIGTERM,SIGUSR1) ends in exit code 75: requeue me.
- The first SIGINT (Ctrl-C) is handled the same way but ends in exit code 130 (interrupted: a person
  asked, so nothing requeues it); a second SIGINT means "stop now": exit 130 at once, no checkpoint.

Python runs signal handlers only when the main thread is back in the interpreter, which a rank blocked
in a collective may never be. So the C-level handler's wake-up byte goes to a pipe read by a watcher
thread: it records the signal at once and arms the forced-exit deadline even if the main thread is
stuck. The main thread acts at the next step boundary, where ranks agree by all-reducing the flag.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

from truestep.core.errors import ExitCode
from truestep.core.status import StopReason
from truestep.parallel.dist import DistContext
from truestep.resilience import early_signals

# Agreement flags, all-reduced with MAX: an interrupt wins over a preemption on another rank.
NONE, PREEMPT, INTERRUPT = 0, 1, 2


class SignalWatcher:
    """Owns the handlers and the watcher thread; `received` is the first signal's name or None."""

    def __init__(self, preemption: list[signal.Signals], deadline_s: float, hard_exit_code: int) -> None:
        self.received: str | None = None
        self.received_at: float | None = None
        self.flag = NONE
        self.interrupts = 0
        self.deadline_s = deadline_s
        """The forced-exit deadline a signal arriving now gets (the preemption hook re-fits it each step)."""
        self.armed_s = deadline_s
        self.hard_exit_code = hard_exit_code
        self.preemption = list(preemption)
        self._deadline: threading.Timer | None = None
        self.signums = self.preemption + ([] if signal.SIGINT in self.preemption else [signal.SIGINT])
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        early = {signal.Signals[name] for name in early_signals.EARLY_SIGNALS}
        self._old_handlers = {s: signal.getsignal(s) for s in early | set(self.signums)}
        for signum in self.signums:
            signal.signal(signum, lambda *_: None)  # real work happens in the watcher thread
        self._old_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="truestep-signals", daemon=True)
        self._thread.start()
        self._adopt_early()

    def _adopt_early(self) -> None:
        """Take over signals recorded before this watcher existed (during imports and set-up)."""
        handled = {s.name for s in self.signums}
        for name, at in early_signals.pending:
            if name in handled:
                self._note(signal.Signals[name], at)
            else:  # not a preemption signal for this config: its default action, as if never caught
                signal.signal(signal.Signals[name], signal.SIG_DFL)
                os.kill(os.getpid(), signal.Signals[name])
        early_signals.pending.clear()
        for name in early_signals.EARLY_SIGNALS:
            if name not in handled:
                signal.signal(signal.Signals[name], signal.SIG_DFL)

    def _note(self, signum: signal.Signals, at: float) -> None:
        if signum == signal.SIGINT and signum not in self.preemption:
            self.interrupts += 1
            if self.interrupts >= 2:
                print(
                    "truestep: second Ctrl-C: stopping now, without a checkpoint", file=sys.stderr, flush=True
                )
                os._exit(ExitCode.INTERRUPTED)
            flag = INTERRUPT
        else:
            flag = PREEMPT
        if self.received is None:
            self.received, self.received_at = signum.name, at
            self.armed_s = self.deadline_s  # the deadline in force when the signal came
            self._deadline = threading.Timer(self.armed_s, self._force_exit)
            self._deadline.start()
        self.flag = max(self.flag, flag)

    def close(self) -> None:
        """Give the process its signal handling back (a rank returning in-process): the handlers and
        wake-up fd from before this watcher; the watcher thread ends."""
        signal.set_wakeup_fd(self._old_wakeup)
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        os.close(self._write_fd)  # the watcher thread reads the end of the pipe and returns
        self._thread.join()
        if self._deadline is not None:  # the rank got where the deadline guarded: it returned
            self._deadline.cancel()

    def _watch(self) -> None:
        while True:
            data = os.read(self._read_fd, 64)
            if not data:
                os.close(self._read_fd)
                return
            for byte in data:
                if byte in self.signums:
                    self._note(signal.Signals(byte), time.time())

    def _force_exit(self) -> None:
        print(
            f"truestep: graceful stop after {self.received} did not finish within {self.armed_s:g}s; "
            f"exiting hard with {self.hard_exit_code}",
            flush=True,
        )
        os._exit(self.hard_exit_code)

    def agreed_stop(self, ctx: DistContext, agree: bool) -> StopReason | None:
        """Collective when `agree` and distributed: the stop every rank takes at this step boundary."""
        flag = self.flag
        if agree and ctx.distributed:
            t = torch.tensor([flag], dtype=torch.int64, device=ctx.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            flag = int(t.item())
        return {NONE: None, PREEMPT: StopReason.PREEMPTED, INTERRUPT: StopReason.INTERRUPTED}[flag]
