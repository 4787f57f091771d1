"""Preemption signals: caught on any rank, agreed across ranks, ending in an emergency save and a
"requeue me" exit code.

Python runs signal handlers only when the main thread is back in the interpreter, which a rank blocked
in a collective may never be. So the C-level handler's wake-up byte goes to a pipe read by a watcher
thread: it records the signal at once and arms the forced-exit deadline even if the main thread is
stuck. The main thread acts at the next step boundary, where ranks agree by all-reducing the flag.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from truestep.resilience import early_signals

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer


class SignalWatcher:
    """Owns the handlers and the watcher thread; `received` is the first signal's name or None."""

    def __init__(self, names: list[str], deadline_s: float, hard_exit_code: int) -> None:
        self.received: str | None = None
        self.received_at: float | None = None
        self.deadline_s = deadline_s
        self.hard_exit_code = hard_exit_code
        self.signums = [signal.Signals[name] for name in names]
        self._read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        for signum in self.signums:
            signal.signal(signum, lambda *_: None)  # real work happens in the watcher thread
        self._old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="truestep-signals", daemon=True).start()
        self._adopt_early()

    def _adopt_early(self) -> None:
        """Take over signals recorded before this watcher existed (during imports and set-up)."""
        handled = {s.name for s in self.signums}
        for name, at in early_signals.pending:
            if name in handled:
                if self.received is None:
                    self.received, self.received_at = name, at
                    threading.Timer(self.deadline_s, self._force_exit).start()
            else:  # not a preemption signal for this config: its default action, as if never caught
                signal.signal(signal.Signals[name], signal.SIG_DFL)
                os.kill(os.getpid(), signal.Signals[name])
        early_signals.pending.clear()
        for name in early_signals.EARLY_SIGNALS:
            if name not in handled:
                signal.signal(signal.Signals[name], signal.SIG_DFL)

    def _watch(self) -> None:
        while True:
            data = os.read(self._read_fd, 64)
            for byte in data:
                if byte in self.signums and self.received is None:
                    self.received = signal.Signals(byte).name
                    self.received_at = time.time()
                    threading.Timer(self.deadline_s, self._force_exit).start()

    def _force_exit(self) -> None:
        print(
            f"truestep: graceful stop after {self.received} did not finish within {self.deadline_s}s; "
            f"exiting hard with {self.hard_exit_code}",
            flush=True,
        )
        os._exit(self.hard_exit_code)


class SignalHook:
    def __init__(self) -> None:
        self.watcher: SignalWatcher | None = None

    def on_start(self, trainer: Trainer) -> None:
        r = trainer.cfg.resilience
        names = [x.strip() for x in r.signals.split(",") if x.strip()]
        self.watcher = SignalWatcher(names, r.exit_deadline_s, r.requeue_exit_code + 1)

    def _agreed(self, trainer: Trainer) -> bool:
        assert self.watcher is not None
        mine = self.watcher.received is not None
        if not (trainer.ctx.distributed and trainer.cfg.resilience.signal_agreement):
            return mine
        flag = torch.tensor([1 if mine else 0], dtype=torch.int64, device=trainer.ctx.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        assert self.watcher is not None
        if trainer.stop_reason is None and self._agreed(trainer):
            trainer.stop_reason = "preempted"
            trainer.logs.event(
                "signal_received",
                signal=self.watcher.received or "peer",
                received_at=self.watcher.received_at,
                stop_step=trainer.state.step,
            )

    def on_end(self, trainer: Trainer) -> None:
        pass
