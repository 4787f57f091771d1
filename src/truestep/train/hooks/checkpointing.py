"""Checkpoint policy: where the run starts (resume, init_from or step 0), when to save (interval,
final, emergency), completing async saves, and rolling back. The mechanism is the checkpoint room's."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from truestep.checkpoint.catalog import committed_dirs, run_checkpoint_root
from truestep.checkpoint.errors import CheckpointContentError, ResumeError
from truestep.checkpoint.init_from import load_init_weights
from truestep.checkpoint.ownership import current_run_id, foreign_run
from truestep.checkpoint.resolver import quarantine_logged, resolve_rollback, resolve_start
from truestep.checkpoint.saver import Checkpointer
from truestep.checkpoint.state import restore
from truestep.core.status import Phase
from truestep.faults.hooks import fault_point
from truestep.faults.hooks import set_context as set_fault_context
from truestep.telemetry.digest import local_digest
from truestep.train.hooks.base import Hook
from truestep.train.restored_digest import verify_restored_digest

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer


@contextmanager
def _phase(trainer: Trainer, phase: Phase) -> Iterator[None]:
    """Tell the heartbeat the rank is checkpointing or restoring, so slow I/O is not mistaken for a hang."""
    previous, trainer.status.phase = trainer.status.phase, phase
    try:
        yield
    finally:
        trainer.status.phase = previous


class CheckpointHook(Hook):
    def __init__(self, fence: Callable[[], None], attempt: int) -> None:
        self.fence = fence
        self.attempt = attempt
        self.checkpointer: Checkpointer | None = None
        self.restore_facts: dict[str, Any] = {}
        """What the last restore reported (checkpoint.state.restore), for the resume self-check."""

    def on_start(self, trainer: Trainer) -> None:
        cfg = trainer.cfg.checkpoint
        root = run_checkpoint_root(trainer.run_dir, cfg.dir)
        self.run_id = current_run_id(trainer.run_dir)
        self.checkpointer = Checkpointer(
            root,
            cfg,
            trainer.ctx,
            trainer.logs,
            trainer.trajectory_keys,
            self.fence,
            self.attempt,
            self.run_id,
        )
        set_fault_context(newest_committed=partial(self._newest_committed, root))
        with _phase(trainer, Phase.RESTORE):
            ckpt_dir = self._resume(trainer, root)
            if ckpt_dir is None and cfg.init_from:
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

    def _newest_committed(self, root: Path) -> Path | None:
        """The checkpoint a restart would resume from, once a commit this rank has under way is done."""
        assert self.checkpointer is not None
        self.checkpointer.join_commit()
        return next(iter(committed_dirs(root)), None)

    def _resume(self, trainer: Trainer, root: Path) -> Path | None:
        """Collective. Resolve and restore; a checkpoint whose bytes turn out bad while loading (it
        verified, but e.g. a tensor is stored in another dtype than declared) is quarantined and the
        next older one is tried, exactly as if it had failed verification. Every piece of state comes
        from the checkpoint finally loaded: the failed attempt's partial load is overwritten entirely;
        when none loads and the run starts fresh, the trainer is reset to its initial state."""
        cfg = trainer.cfg.checkpoint
        failed_loads = 0
        while True:
            ckpt_dir = resolve_start(root, cfg, trainer.ctx, trainer.logs)
            if ckpt_dir is None:  # a fresh start: the trainer is only allocated, or holds a failed load's
                trainer.initialize()  # partial state, of which nothing may remain
                if failed_loads:
                    trainer.logs.event("state_reset", after_failed_loads=failed_loads)
                return None
            try:
                self._restore(trainer, ckpt_dir)
                self._say_if_copied(trainer, ckpt_dir)
                return ckpt_dir
            except CheckpointContentError as err:  # raised on every rank: DCP gathers load failures
                failed_loads += 1
                if trainer.ctx.is_main:
                    quarantine_logged(ckpt_dir, f"failed to load: {err}", trainer.logs)

    def _say_if_copied(self, trainer: Trainer, ckpt_dir: Path) -> None:
        """One line (and one event) when the checkpoint resumed from was committed in another run
        directory: its attempt numbers are that run's, and never fence or limit this run's saves."""
        origin = foreign_run(ckpt_dir, self.run_id)
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

    def _restore(self, trainer: Trainer, ckpt_dir: Path) -> None:
        assert self.checkpointer is not None
        started = time.perf_counter()
        fault_point("restore", step=trainer.state.step)
        facts = restore(
            trainer, ckpt_dir, trainer.cfg.checkpoint, trainer.ctx, trainer.trajectory_keys, trainer.logs
        )
        if trainer.state.step > trainer.cfg.train.max_steps:
            raise ResumeError(
                f"{ckpt_dir} is at step {trainer.state.step}, beyond train.max_steps="
                f"{trainer.cfg.train.max_steps}: it belongs to a longer run. Raise train.max_steps to continue "
                "it, or use another run directory"
            )
        facts.update(verify_restored_digest(trainer, ckpt_dir, facts))
        self.restore_facts = facts
        trainer.status.step = trainer.state.step
        self.checkpointer.last_saved_step = trainer.state.step
        trainer.logs.event(
            "checkpoint_restore", path=str(ckpt_dir), restore_s=time.perf_counter() - started, **facts
        )

    def rollback(self, trainer: Trainer) -> int:
        """Collective. Restore the newest verified checkpoint in place; returns its step."""
        assert self.checkpointer is not None
        with _phase(trainer, Phase.RESTORE):
            self.checkpointer.wait()
            ckpt_dir = resolve_rollback(
                self.checkpointer.root, trainer.cfg.checkpoint, trainer.ctx, trainer.logs
            )
            self._restore(trainer, ckpt_dir)
        return trainer.state.step

    def _save(self, trainer: Trainer, reason: str) -> None:
        assert self.checkpointer is not None
        digest = lambda: local_digest(trainer.model)  # noqa: E731 - computed inside save's timing
        self.checkpointer.save(trainer.state.step, trainer, reason, digest)

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        assert self.checkpointer is not None
        with _phase(trainer, Phase.CHECKPOINT):
            self.checkpointer.poll()
            interval = trainer.cfg.checkpoint.interval
            if interval and trainer.state.step % interval == 0:
                self._save(trainer, "interval")

    def on_end(self, trainer: Trainer) -> None:
        assert self.checkpointer is not None
        with _phase(trainer, Phase.CHECKPOINT):
            self._save(trainer, str(trainer.stop_reason or "final"))
            self.checkpointer.wait()
