"""Where a run starts, and the one owner of every restore: `Restorer.start()` returns the `Start` the loop
hands to every hook, `Restorer.rollback()` the `Restored` of a NaN rollback.

A start resolves the newest usable checkpoint and restores it; a checkpoint whose bytes turn out bad
while loading (it verified, but a tensor is stored in another dtype than declared, or the restored
parameters are not the saved ones) is quarantined and the next older one is tried, exactly as if it had
failed verification. Every piece of state comes from the checkpoint finally loaded; when none loads and
the run starts fresh, the trainer is initialized (`Trainer.initialize`, this rank's shards only), so
nothing of a failed load remains. The trainer was only allocated: a restore draws no random init (under
the naive ablation, `TrustingCommit.loads_over_init`, it initializes first, as the trainer it reproduces
does at build). A fresh run may start from given weights (`checkpoint.init_from`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from truestep.checkpoint.catalog import committed_dirs, run_checkpoint_root, step_of
from truestep.checkpoint.errors import CheckpointContentError, ResumeError
from truestep.checkpoint.init_from import load_init_weights
from truestep.checkpoint.mechanisms import Mechanisms
from truestep.checkpoint.memory.restore import MemoryUnavailable
from truestep.checkpoint.ownership import foreign_run
from truestep.checkpoint.resolver import decide_on_rank0, quarantine_logged, resolve_rollback, resolve_start
from truestep.checkpoint.restore import restore_from_disk
from truestep.checkpoint.restored import Restored
from truestep.checkpoint.saver import Checkpointer
from truestep.core.names import METRICS_FILE
from truestep.core.status import Phase
from truestep.faults.hooks import fault_point
from truestep.parallel.dist import broadcast_int
from truestep.telemetry.jsonl import iter_jsonl
from truestep.train.memory import MemoryPath
from truestep.train.trainer import Trainer


@dataclass(frozen=True)
class Start:
    """How this attempt's state came to be: restored, or initialized (possibly from given weights)."""

    restored: Restored | None
    """The restore, or None for a fresh start."""
    init_from: dict[str, Any] | None = None
    """What `checkpoint.init_from` loaded (its event's facts), for a fresh start from given weights."""


class Restorer:
    def __init__(
        self,
        trainer: Trainer,
        checkpointer: Checkpointer,
        mechanisms: Mechanisms,
        memory: MemoryPath | None = None,
    ) -> None:
        self.trainer = trainer
        self.checkpointer = checkpointer
        self.mechanisms = mechanisms
        self.memory = memory
        """The memory path (resilience.snapshot_every_steps > 0): tried before the disk."""
        self.root = run_checkpoint_root(trainer.run_dir, trainer.cfg.checkpoint.dir)

    def start(self) -> Start:
        """Collective. Restore from memory when it can serve, else the newest usable checkpoint, else
        start fresh."""
        trainer, cfg = self.trainer, self.trainer.cfg.checkpoint
        with self._phase():
            if self.mechanisms.commit.loads_over_init:
                trainer.initialize()  # the naive trainer: initialized at build, a torn load over that
            touched = False
            if self.memory is not None and cfg.resume:
                restored, touched = self._from_memory()
                if restored is not None:
                    return Start(restored)
                self.memory.forget()  # what the disk restores begins a new timeline
            restored = self._resume(failed_loads=int(touched))
            if restored is not None:
                return Start(restored)
            if not cfg.init_from:
                return Start(None)
            # A fresh run starting from given weights (e.g. imported from Hugging Face); collective.
            facts = load_init_weights(trainer.model, cfg.init_from, cfg.verify_checksums, trainer.ctx)
            trainer.logs.event("init_from", **facts)
            if facts["config_differences"] and trainer.ctx.is_main:
                # A wrong RoPE base trains fine and silently worse: say so where the user looks.
                print(
                    f"truestep train: warning: checkpoint.init_from={facts['path']}: the configured model "
                    "differs from the one the weights were trained with: "
                    + "; ".join(facts["config_differences"]),
                    file=sys.stderr,
                    flush=True,
                )
            return Start(None, facts)

    def rollback(self) -> Restored:
        """Collective. Restore the newest verified checkpoint in place (the NaN guard's rollback)."""
        trainer = self.trainer
        with self._phase():
            self.checkpointer.wait()
            ckpt_dir = resolve_rollback(
                self.root, trainer.cfg.checkpoint, trainer.ctx, trainer.logs, self.mechanisms.commit
            )
            return self._restore(ckpt_dir)

    @contextmanager
    def _phase(self) -> Iterator[None]:
        """The heartbeat reports `restore` while loading (slow I/O is not a hang)."""
        status = self.trainer.status
        previous, status.phase = status.phase, Phase.RESTORE
        try:
            yield
        finally:
            status.phase = previous

    def _from_memory(self) -> tuple[Restored | None, bool]:
        """Collective. (the restore, or None and whether the state was touched before it fell through)."""
        trainer = self.trainer
        assert self.memory is not None
        fault_point("restore", step=trainer.state.step)
        disk_newest = decide_on_rank0(
            lambda: next((step_of(d) or 0 for d in committed_dirs(self.root)), -1), trainer.ctx
        )
        try:
            restored, facts = self.memory.restore(self.mechanisms.parts, disk_newest)
        except MemoryUnavailable as err:
            trainer.logs.event("memory_restore_skipped", reason=str(err), touched=err.touched)
            quiet = err.quiet and self._last_logged() < 0  # a fresh run: nothing was lost, nothing to say
            if trainer.ctx.is_main and not quiet:
                where = "recovering from disk" if disk_newest >= 0 else "no committed checkpoint either"
                print(f"truestep train: {where}: {err}", file=sys.stderr, flush=True)
            return None, err.touched
        restored = replace(restored, steps_lost=self._steps_lost(restored.step))
        trainer.status.step = trainer.state.step
        trainer.logs.event("memory_restore", **restored.event_fields(), **facts)
        return restored, False

    def _steps_lost(self, step: int) -> int | None:
        """Steps earlier attempts logged past `step` (recomputed now), from rank 0's metrics.jsonl."""
        last = self._last_logged()
        return max(0, last - step) if last >= 0 else None

    def _last_logged(self) -> int:
        """Collective: the newest step an earlier attempt logged (rank 0 reads it; -1 when none)."""
        trainer = self.trainer
        last = -1
        if trainer.ctx.is_main:
            try:
                last = _last_logged_step(trainer.run_dir / METRICS_FILE, trainer.logs.attempt)
            except (OSError, UnicodeDecodeError, ValueError):
                last = -1
        return broadcast_int(last, trainer.ctx)

    def _resume(self, failed_loads: int = 0) -> Restored | None:
        trainer, cfg = self.trainer, self.trainer.cfg.checkpoint
        while True:
            ckpt_dir = resolve_start(self.root, cfg, trainer.ctx, trainer.logs, self.mechanisms.commit)
            if ckpt_dir is None:  # a fresh start: the trainer is only allocated, or holds a failed
                trainer.initialize()  # load's partial state (memory or disk), of which nothing may remain
                if failed_loads:
                    trainer.logs.event("state_reset", after_failed_loads=failed_loads)
                return None
            try:
                restored = self._restore(ckpt_dir)
            except CheckpointContentError as err:  # raised on every rank: DCP gathers load failures
                failed_loads += 1
                if trainer.ctx.is_main:
                    quarantine_logged(ckpt_dir, f"failed to load: {err}", trainer.logs)
                continue
            self._say_if_copied(ckpt_dir)
            return restored

    def _restore(self, ckpt_dir: Path) -> Restored:
        trainer = self.trainer
        fault_point("restore", step=trainer.state.step)
        restored = restore_from_disk(
            trainer,
            ckpt_dir,
            trainer.cfg.checkpoint,
            trainer.ctx,
            trainer.trajectory_keys,
            trainer.logs,
            self.mechanisms,
        )
        if trainer.state.step > trainer.cfg.train.max_steps:
            raise ResumeError(
                f"{ckpt_dir} is at step {trainer.state.step}, beyond train.max_steps="
                f"{trainer.cfg.train.max_steps}: it belongs to a longer run. Raise train.max_steps to continue "
                "it, or use another run directory"
            )
        trainer.status.step = trainer.state.step
        self.checkpointer.last_saved_step = trainer.state.step
        restored = replace(restored, steps_lost=self._steps_lost(restored.step))
        trainer.logs.event("checkpoint_restore", **restored.event_fields())
        return restored

    def _say_if_copied(self, ckpt_dir: Path) -> None:
        """One line (and one event) when the checkpoint resumed from was committed in another run
        directory: its attempt numbers are that run's, and never fence or limit this run's saves."""
        trainer = self.trainer
        origin = foreign_run(ckpt_dir, self.checkpointer.run_id)
        if origin is None:
            return
        trainer.logs.event("checkpoint_from_other_run", path=str(ckpt_dir), origin_run_id=origin)
        if trainer.ctx.is_main:
            print(
                f"truestep train: resuming from checkpoints copied from another run directory "
                f"({ckpt_dir.name}, run {origin}); this run's saves and retention are its own",
                file=sys.stderr,
                flush=True,
            )


def _last_logged_step(metrics: Path, attempt: int) -> int:
    """The newest step an earlier attempt logged (-1 when none)."""
    last = -1
    for line in iter_jsonl(metrics):
        step, when = line.get("step"), line.get("attempt")
        if isinstance(step, int) and isinstance(when, int) and when < attempt and not isinstance(step, bool):
            last = max(last, step)
    return last
