"""What a hook sees of the run at a step boundary (`StepView`), and the few things it may ask of the loop.

Hooks read through it; they do not write the trainer's fields. The only writes a hook can make are the
requests below: stop at this step boundary, roll back to a checkpoint (performed by the loop once every
hook has seen the step), and the phase the heartbeat reports while the hook works. The model and the
optimizer are exposed for reading (digests, a forward pass without an update), and a checkpoint save
reads the trainer through the `Checkpointable` protocol.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from truestep.config.schema import JobConfig
from truestep.core.status import Phase, StopReason
from truestep.parallel.dist import DistContext
from truestep.telemetry.run_logs import RunLogs

if TYPE_CHECKING:
    from truestep.checkpoint.state import Checkpointable
    from truestep.train.trainer import Trainer, TrainState

Batch = list[tuple[torch.Tensor, torch.Tensor]]


class StepView:
    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer
        self._rollback_requested = False
        self._update_hooks: list[Any] = []

    # --- what a hook may read ---------------------------------------------------------------------

    @property
    def cfg(self) -> JobConfig:
        return self._trainer.cfg

    @property
    def ctx(self) -> DistContext:
        return self._trainer.ctx

    @property
    def logs(self) -> RunLogs:
        return self._trainer.logs

    @property
    def run_dir(self) -> Path:
        return self._trainer.run_dir

    @property
    def step(self) -> int:
        """Optimizer steps completed."""
        return self._trainer.state.step

    @property
    def state(self) -> TrainState:
        """A copy of the counters (changing it changes nothing)."""
        return dataclasses.replace(self._trainer.state)

    @property
    def stop_reason(self) -> StopReason | None:
        return self._trainer.stop_reason

    @property
    def longest_step_s(self) -> float:
        """The longest step this process has completed (seconds, batch fetch included)."""
        return self._trainer.status.longest_step_s

    @property
    def tokens_per_step(self) -> int:
        return self._trainer.tokens_per_step

    @property
    def model(self) -> torch.nn.Module:
        """For reading: digests, a forward pass without an update."""
        return self._trainer.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """For reading: digests of its state."""
        return self._trainer.optimizer

    @property
    def checkpointable(self) -> Checkpointable:
        """What a checkpoint save reads."""
        return self._trainer

    def tokens_per_source(self) -> dict[str, int] | None:
        return self._trainer.loader.tokens_per_source()

    def data_position(self) -> dict[str, Any]:
        """The loader's position: the next global batch (layout-invariant by design)."""
        return self._trainer.loader.state_dict()

    @property
    def loss_masked(self) -> bool:
        """Whether the data masks the loss (chat data: train/loss.py)."""
        return self._trainer.loader.loss_masked

    def peek_batch(self) -> Batch:
        """This rank's micro-batches of the next step; the loader is put back (nothing moves)."""
        loader = self._trainer.loader
        cursor = loader.state_dict()
        batch = loader.next()
        loader.load_state_dict(cursor)
        return batch

    # --- what a hook may ask for ------------------------------------------------------------------

    def request_stop(self, reason: StopReason) -> None:
        """Stop at this step boundary (the first request wins)."""
        if self._trainer.stop_reason is None:
            self._trainer.stop_reason = reason

    def request_rollback(self) -> None:
        """Roll back to the newest verified checkpoint once every hook has seen this step."""
        self._rollback_requested = True

    def take_rollback_request(self) -> bool:
        """The loop's side of request_rollback: whether one was made since the last call."""
        requested, self._rollback_requested = self._rollback_requested, False
        return requested

    def before_optimizer_step(self, wait: Callable[[], None]) -> None:
        """Run `wait` before every optimizer update (e.g. until a copy of the state it changes is taken)."""
        handle = self._trainer.optimizer.register_step_pre_hook(lambda optimizer, args, kwargs: wait())
        self._update_hooks.append(handle)

    def release(self) -> None:
        """The loop is over: what hooks registered on the trainer through the view is removed."""
        for handle in self._update_hooks:
            handle.remove()
        self._update_hooks.clear()

    @contextmanager
    def phase(self, phase: Phase) -> Iterator[None]:
        """Tell the heartbeat what this hook is doing (slow I/O is not mistaken for a hang)."""
        status = self._trainer.status
        previous, status.phase = status.phase, phase
        try:
            yield
        finally:
            status.phase = previous
