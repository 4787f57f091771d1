"""One rank's whole run: process group, run directory ownership, the trainer, the hooks, the loop,
and the exit code. The front door (train/rank.py: `run_rank`) calls `run_training` once the config and
the launch record are loaded and (under the supervisor) the heartbeat is already beating; it returns
the exit code after leaving the process group (only the CLI exits the process).

Without a supervisor (a plain `truestep train` or torchrun), rank 0 takes the run directory lease
itself, begins the attempt (resilience/attempt.py: `begin_attempt`, as node 0's supervisor does) and
broadcasts its number; a second job into a leased directory is refused
on every rank before anything is written. Rank 0 first checks the run directory's own entries
(core/rundir.py): a symlinked `metrics.jsonl` is refused before anything is written through it.

Every way a rank can stop on expected bad input or a failing environment ends here as one line on
stderr and a documented exit code (`failure_of`): a refusal (its own code, printed once by rank 0 when
every rank shares it), a filesystem that refuses a write (exit 6, "no space left on device: PATH"),
another I/O error, running out of memory, or a broken process group (exit 1). Only a bug prints a
traceback; the traceback of the others goes to the event log (`run_failed`).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

import torch

import truestep
from truestep.checkpoint.catalog import run_checkpoint_root
from truestep.checkpoint.mechanisms import choose
from truestep.checkpoint.ownership import current_run_id
from truestep.checkpoint.resolver import decide_on_rank0
from truestep.checkpoint.saver import Checkpointer
from truestep.config.schema import JobConfig
from truestep.core.errors import (
    ExitCode,
    FencedError,
    RunDirBusyError,
    TruestepError,
    causes,
    expected_failure,
)
from truestep.core.fsio import make_dir
from truestep.core.launch import Launch
from truestep.core.names import TENSORBOARD_DIR
from truestep.core.rundir import check_run_dir
from truestep.core.say import say
from truestep.core.status import RankStatus, StopReason
from truestep.faults.hooks import set_context as set_fault_context
from truestep.parallel.dist import DistContext, broadcast_int, init_distributed, leave
from truestep.parallel.peer_loss import peer_left
from truestep.resilience.attempt import Attempt, begin_attempt
from truestep.resilience.heartbeat import Heartbeat
from truestep.resilience.lease import RunDirLease
from truestep.telemetry import startup
from truestep.telemetry.narrate import Narrator
from truestep.telemetry.run_logs import RunLogs
from truestep.telemetry.tensorboard import ScalarSinks
from truestep.telemetry.wandb_logger import WandbWriter
from truestep.train.hooks import (
    CheckpointHook,
    CollectiveTimeoutHook,
    EvalHook,
    Hook,
    MetricsHook,
    NanGuardHook,
    PreemptionHook,
)
from truestep.train.hooks.snapshot import SnapshotHook
from truestep.train.loop import train_loop
from truestep.train.memory import MemoryPath
from truestep.train.restorer import Restorer
from truestep.train.selfcheck import SelfCheckHook, StopWitnessHook
from truestep.train.trainer import Trainer

BUSY = -1


def build_hooks(
    checkpointer: Checkpointer, sinks: ScalarSinks, memory: MemoryPath | None = None
) -> list[Hook]:
    """One hook per mechanism; the loop runs them in their `Slot` order (train/hooks/base.py). Hooks that
    share an output share the object (the scalar sinks: TensorBoard, W&B), never each other."""
    hooks: list[Hook] = [
        SelfCheckHook(sinks),
        CheckpointHook(checkpointer),
        StopWitnessHook(),
        CollectiveTimeoutHook(),
        MetricsHook(sinks),
        EvalHook(sinks),
        NanGuardHook(),
        PreemptionHook(),
    ]
    if memory is not None:
        hooks.append(SnapshotHook(memory))
    return hooks


def scalar_sinks(cfg: JobConfig, ctx: DistContext, run_dir: Path, attempt: int) -> ScalarSinks:
    """Rank 0's TensorBoard and W&B outputs, each when it is on (the other ranks write none)."""
    m = cfg.metrics
    tensorboard = run_dir / TENSORBOARD_DIR if ctx.is_main and m.tensorboard else None
    wandb = (
        (lambda: WandbWriter(run_dir, cfg, m.wandb, attempt)) if ctx.is_main and m.wandb != "off" else None
    )
    return ScalarSinks(tensorboard, wandb)


def exit_code(cfg: JobConfig, stop_reason: StopReason | None) -> int:
    if stop_reason == StopReason.PREEMPTED:
        return cfg.resilience.requeue_exit_code
    if stop_reason == StopReason.INTERRUPTED:
        return ExitCode.INTERRUPTED
    return ExitCode.OK


def _lost_lease(err: FencedError) -> None:
    print(f"truestep train: {err}", file=sys.stderr, flush=True)
    os._exit(ExitCode.FENCED)


def failure_of(err: BaseException, supervised: bool = False) -> tuple[int, str] | None:
    """(exit code, one line) for an expected way to stop; None for a bug (which keeps its traceback).
    `core.errors.expected_failure`, plus what only a training process meets: memory, the process group.
    A collective broken because another rank is gone is the echo of that rank's failure, not a network
    fault: under a supervisor (`supervised`), whose "failure detected" line names the rank, the line
    says so and points there; without one it says a peer left (gloo's words in parentheses)."""
    failure = expected_failure(err)
    if failure is not None:
        code, line = failure
        if code == ExitCode.STORAGE:
            line += "; free space (or fix the filesystem) and start again: the run resumes from its newest verified checkpoint"
        return code, line
    oom = next((c for c in causes(err) if _out_of_memory(c)), None)
    if oom is not None:
        return int(
            ExitCode.FAILURE
        ), f"out of memory: {str(oom).splitlines()[0] if str(oom) else type(oom).__name__}"
    gone = next((peer_left(c) for c in causes(err) if peer_left(c)), None)
    if gone is not None:
        if supervised:
            line = "stopping: another rank of this job failed (see the supervisor's 'failure detected' line)"
        else:
            line = f"stopping: a peer rank left the process group (it exited or was killed; gloo: {gone})"
        return int(ExitCode.FAILURE), f"{line}; details in events.jsonl"
    dist_error = next((c for c in causes(err) if isinstance(c, torch.distributed.DistError)), None)
    if dist_error is not None:
        return int(ExitCode.FAILURE), f"process group failed: {str(dist_error).splitlines()[0]}"
    return None


def _out_of_memory(err: BaseException) -> bool:
    return isinstance(err, MemoryError | torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err)
    )


def claim_run_dir(cfg: JobConfig, ctx: DistContext, launch: Launch) -> Attempt:
    """Collective. Rank 0 checks the run directory and takes the lease, then begins an attempt; every
    rank learns its number (or every rank refuses)."""
    run_dir = Path(cfg.run.dir)
    decide_on_rank0(lambda: _checked_run_dir(run_dir), ctx)
    job = launch.job_identity()
    attempt: Attempt | None = None
    number, busy = 0, None
    if ctx.is_main:
        make_dir(run_dir)
        lease = RunDirLease(run_dir, job, cfg.resilience.lease_ttl_s, launch.generation)
        try:
            lease.acquire()
            attempt = begin_attempt(lease)
            number = attempt.number
            lease.keep(_lost_lease)
        except RunDirBusyError as err:
            busy, number = err, BUSY
    number = broadcast_int(number, ctx)
    if number == BUSY:
        raise busy or RunDirBusyError(f"run directory {run_dir} is in use by another job (see rank 0)")
    return attempt or Attempt(number, job, lambda: None)


def _checked_run_dir(run_dir: Path) -> int:
    check_run_dir(run_dir)
    make_dir(run_dir)
    return 0


def run_training(cfg: JobConfig, launch: Launch, status: RankStatus, attempt: Attempt | None) -> int:
    """Train this rank to the end (or a stop), leave the process group, return the run's exit code."""
    began = time.time()
    startup.begin(import_s=began - truestep.STARTED_AT)  # reported in run_start's startup_phases
    ctx = init_distributed(cfg, launch)
    rendezvous = {"began": began, "rendezvous_s": time.time() - began}
    clean = True
    heartbeat: Heartbeat | None = None
    hooks: list[Hook] = []
    try:
        if attempt is None:
            attempt = claim_run_dir(cfg, ctx, launch)
            set_fault_context(run_dir=Path(cfg.run.dir), attempt=attempt.number)  # supervised: run_rank
            if cfg.resilience.heartbeat:
                run_dir, interval = Path(cfg.run.dir), cfg.resilience.heartbeat_interval_s
                heartbeat = Heartbeat(run_dir, ctx.rank, attempt.number, status, interval)
                heartbeat.start()
        elif ctx.is_main:
            check_run_dir(Path(cfg.run.dir))  # the supervisor checked too; files can appear since
        code = _train(cfg, ctx, status, attempt, rendezvous, hooks, launch)
    except BaseException as err:  # noqa: BLE001 - classified below; a bug is re-raised untouched
        failure = failure_of(err, launch.supervised)
        if failure is None:
            raise
        code, line = failure
        # A refusal every rank shares is printed once, by rank 0, as the job's; one rank's own failure
        # by that rank, always saying which (rank 0 too: several ranks may say it, in any order).
        rank_local = not isinstance(err, TruestepError) or err.rank_local
        if ctx.is_main or rank_local:
            who = f"rank {ctx.rank}: " if ctx.distributed and rank_local else ""
            if launch.debug:  # truestep --debug
                traceback.print_exception(err)
            say(f"truestep train: {who}{line}")  # one write: the supervisor's lines share this stderr
        clean = False  # some ranks may not share the error: no barrier
    if attempt is not None and attempt.lease is not None:
        try:
            attempt.lease.release()
        except OSError as err:  # e.g. the disk filled up: say so if nothing else was said
            if code == ExitCode.OK:
                code, line = failure_of(err) or (int(ExitCode.FAILURE), str(err))
                say(f"truestep train: releasing the run directory lease: {line}")
            # else the run already failed and said why; a dead holder's lease is taken over at the next start
    leave(ctx, clean, debug=launch.debug)
    # What this rank started in its process is over with it (a rank run in-process returns here).
    if heartbeat is not None:
        heartbeat.stop()
    for hook in hooks:
        hook.close()
    return code


def _train(
    cfg: JobConfig,
    ctx: DistContext,
    status: RankStatus,
    attempt: Attempt,
    rendezvous: dict[str, float],
    hooks: list[Hook],
    launch: Launch,
) -> int:
    """Build the trainer, its checkpointing and its hooks (appended to `hooks`, which the caller closes
    whatever happens), run the loop, return the exit code its stop reason says."""
    run_dir = Path(cfg.run.dir)
    narrator = Narrator(
        "truestep train",
        says_exit=not launch.supervised,
        requeue_code=cfg.resilience.requeue_exit_code,
        enabled=cfg.metrics.narrate,
        banner=cfg.metrics.banner,
    )
    logs = RunLogs(run_dir, attempt.number, enabled=ctx.is_main, narrator=narrator)
    logs.event("rendezvous", **rendezvous)  # process group and mesh up: a phase of MTTR
    try:
        trainer = Trainer(cfg, ctx, logs, status)
        run_id = current_run_id(run_dir)
        mechanisms = choose(cfg.checkpoint)  # the ablation variants, chosen once for this rank
        checkpointer = Checkpointer(
            run_checkpoint_root(run_dir, cfg.checkpoint.dir),
            cfg.checkpoint,
            ctx,
            logs,
            trainer.trajectory_keys,
            attempt.fence,
            attempt.number,
            run_id,
            mechanisms,
        )
        memory = None
        if cfg.resilience.snapshot_every_steps and run_id:  # a run without a lease has no memory to name
            memory = MemoryPath(trainer, run_id, launch.local_world_size)
        hooks.extend(build_hooks(checkpointer, scalar_sinks(cfg, ctx, run_dir, attempt.number), memory))
        train_loop(trainer, hooks, Restorer(trainer, checkpointer, mechanisms, memory))
    except TruestepError as err:
        logs.event("run_refused", error=type(err).__name__, message=str(err), exit_code=int(err.exit_code))
        raise
    except BaseException as err:
        failure = failure_of(err, launch.supervised)
        if failure is not None:  # expected: one line on stderr, the traceback here
            trace = "".join(traceback.format_exception(err))
            logs.event(
                "run_failed",
                error=type(err).__name__,
                message=failure[1],
                exit_code=failure[0],
                traceback=trace,
            )
        raise
    finally:
        logs.close()
    return exit_code(cfg, trainer.stop_reason)
