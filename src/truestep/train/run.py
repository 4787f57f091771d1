"""One rank's whole run: process group, run directory ownership, the trainer, the hooks, the loop,
and the exit code. `truestep train` calls `run_training` once the config is loaded and (under the
supervisor) the heartbeat is already beating.

Without a supervisor (a plain `truestep train` or torchrun), rank 0 takes the run directory lease
itself, counts the attempt and broadcasts its number; a second job into a leased directory is refused
on every rank before anything is written.
"""

from __future__ import annotations

import os
import sys
import time
from functools import partial
from pathlib import Path

from truestep.config.schema import JobConfig
from truestep.core.errors import ExitCode, FencedError, RunDirBusyError, TruestepError
from truestep.core.fsio import make_dir
from truestep.core.status import RankStatus, StopReason
from truestep.faults.hooks import set_context as set_fault_context
from truestep.parallel.dist import DistContext, broadcast_int, init_distributed, shutdown
from truestep.resilience.attempt import Attempt
from truestep.resilience.heartbeat import Heartbeat
from truestep.resilience.lease import RunDirLease, check_fence, job_id
from truestep.telemetry.run_logs import RunLogs
from truestep.train.hooks import (
    CheckpointHook,
    CollectiveTimeoutHook,
    Hook,
    MetricsHook,
    NanGuardHook,
    PreemptionHook,
)
from truestep.train.loop import train_loop
from truestep.train.trainer import Trainer

BUSY = -1


def build_hooks(attempt: Attempt) -> list[Hook]:
    """In call order. Checkpoint first: its on_start restores the state the others then report."""
    checkpoints = CheckpointHook(attempt.fence, attempt.number)
    return [checkpoints, CollectiveTimeoutHook(), MetricsHook(), NanGuardHook(checkpoints), PreemptionHook()]


def exit_code(cfg: JobConfig, stop_reason: StopReason | None) -> int:
    if stop_reason == StopReason.PREEMPTED:
        return cfg.resilience.requeue_exit_code
    if stop_reason == StopReason.INTERRUPTED:
        return ExitCode.INTERRUPTED
    return ExitCode.OK


def _lost_lease(err: FencedError) -> None:
    print(f"truestep train: {err}", file=sys.stderr, flush=True)
    os._exit(ExitCode.FENCED)


def claim_run_dir(cfg: JobConfig, ctx: DistContext) -> Attempt:
    """Collective. Rank 0 takes the lease and starts an attempt; every rank learns its number."""
    run_dir = Path(cfg.run.dir)
    job = job_id()
    lease: RunDirLease | None = None
    number, busy = 0, None
    if ctx.is_main:
        make_dir(run_dir)
        lease = RunDirLease(run_dir, job, cfg.resilience.lease_ttl_s)
        try:
            lease.acquire()
            number = lease.begin_attempt()
            lease.keep(_lost_lease)
        except RunDirBusyError as err:
            busy, number = err, BUSY
    number = broadcast_int(number, ctx)
    if number == BUSY:
        raise busy or RunDirBusyError(f"run directory {run_dir} is in use by another job (see rank 0)")
    fence = partial(check_fence, run_dir, job, number) if ctx.is_main else (lambda: None)
    return Attempt(number, job, fence, lease)


def run_training(cfg: JobConfig, status: RankStatus, attempt: Attempt | None) -> int:
    """Train this rank to the end (or a stop) and exit the process with the run's exit code."""
    began = time.time()
    ctx = init_distributed(cfg)
    rendezvous = {"began": began, "rendezvous_s": time.time() - began}
    clean = True
    try:
        if attempt is None:
            attempt = claim_run_dir(cfg, ctx)
            if cfg.resilience.heartbeat:
                run_dir, interval = Path(cfg.run.dir), cfg.resilience.heartbeat_interval_s
                Heartbeat(run_dir, ctx.rank, attempt.number, status, interval).start()
        code = _train(cfg, ctx, status, attempt, rendezvous)
    except TruestepError as err:
        if ctx.is_main:
            print(f"truestep train: {err}", file=sys.stderr, flush=True)
        code, clean = int(err.exit_code), False  # some ranks may not share the error: no barrier
    if attempt is not None and attempt.lease is not None:
        attempt.lease.release()
    shutdown(ctx, code, clean)
    return code  # not reached: shutdown exits the process


def _train(
    cfg: JobConfig, ctx: DistContext, status: RankStatus, attempt: Attempt, rendezvous: dict[str, float]
) -> int:
    run_dir = Path(cfg.run.dir)
    set_fault_context(run_dir=run_dir, attempt=attempt.number)
    logs = RunLogs(run_dir, attempt.number, enabled=ctx.is_main)
    logs.event("rendezvous", **rendezvous)  # process group and mesh up: a phase of MTTR
    try:
        trainer = Trainer(cfg, ctx, logs, status)
        train_loop(trainer, build_hooks(attempt))
    except TruestepError as err:
        logs.event("run_refused", error=type(err).__name__, message=str(err), exit_code=int(err.exit_code))
        raise
    finally:
        logs.close()
    return exit_code(cfg, trainer.stop_reason)
