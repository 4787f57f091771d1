"""A preemption signal (or Ctrl-C) that arrives while a rank is still starting stops it at the next
start-up checkpoint (before the model is built, and after the restore) instead of after a first step,
a save and possibly the forced-exit deadline: nothing has been trained since the last checkpoint, so
there is nothing to save. Ranks agree (one all-reduce) so that all of them stop together."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from truestep.config.schema import JobConfig
from truestep.core.errors import ExitCode, TruestepError
from truestep.parallel.dist import DistContext
from truestep.resilience import early_signals

NONE, PREEMPT, INTERRUPT = 0, 1, 2


class StoppedInStartup(TruestepError):
    """The rank stops before its first step; `exit_code` is the requeue code or 130 (Ctrl-C)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[assignment] - an int the run returns as its code


def pending_stop(cfg: JobConfig) -> tuple[int, str | None]:
    """This rank's flag from the signals recorded since it started (early_signals.pending)."""
    preemption = set(cfg.resilience.signal_names())
    flag, name = NONE, None
    for signame, _ in early_signals.pending:
        if signame in preemption:
            flag, name = max(flag, PREEMPT), name or signame
        elif signame == "SIGINT":
            flag, name = INTERRUPT, signame
    return flag, name


def stop_if_signalled(
    cfg: JobConfig,
    ctx: DistContext,
    where: str,
    say: Callable[..., None],
    step: int,
    flag: int | None = None,
) -> None:
    """Collective when distributed. Raise StoppedInStartup when any rank got a preemption signal or
    Ctrl-C during start-up, after logging it through `say` (the run's event log: `signal_received` with
    `during_startup`, at `step`, the step the run stands at); `flag`: this rank's (default: from the
    signals recorded so far)."""
    mine, name = pending_stop(cfg) if flag is None else (flag, None)
    agreed = mine
    if ctx.distributed:
        t = torch.tensor([mine], dtype=torch.int64, device=ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        agreed = int(t.item())
    if agreed == NONE:
        return
    code = int(ExitCode.INTERRUPTED) if agreed == INTERRUPT else cfg.resilience.requeue_exit_code
    reason = "interrupted" if agreed == INTERRUPT else "preempted"
    say("signal_received", signal=name or "peer", stop_step=step, stop_reason=reason, during_startup=where)
    what = f"{name or 'a signal'}" if mine else "a peer rank's signal"
    then = "requeue me" if agreed == PREEMPT else "interrupted"
    raise StoppedInStartup(
        f"stopped by {what} during start-up ({where}), before any step: nothing new to save; exit {code} "
        f"({then}): run the same command again to resume",
        code,
    )
