"""NaN guard policy: the trainer skips non-finite updates (agreed: loss and grad norm are global);
this hook logs them and, after K consecutive skips, rolls back to the newest verified checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from truestep.checkpoint.hook import CheckpointHook
    from truestep.train.trainer import StepResult, Trainer


class NanGuardHook:
    def __init__(self, checkpoints: CheckpointHook) -> None:
        self.checkpoints = checkpoints
        self.consecutive = 0
        self.rolled_back_to: set[int] = set()

    def on_start(self, trainer: Trainer) -> None:
        pass

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        if not result.skipped:
            self.consecutive = 0
            return
        self.consecutive += 1
        trainer.logs.event(
            "nonfinite_step_skipped",
            step=trainer.state.step,
            loss=result.loss,
            grad_norm=result.grad_norm,
            consecutive=self.consecutive,
        )
        limit = trainer.cfg.resilience.nan_rollback_after
        if limit and self.consecutive >= limit:
            step = self.checkpoints.rollback(trainer)
            if step in self.rolled_back_to:
                raise RuntimeError(
                    f"non-finite steps recurred after rolling back to step {step}: the divergence is "
                    "deterministic (data or hyperparameters), so another rollback would loop forever"
                )
            self.rolled_back_to.add(step)
            trainer.logs.event("nan_rollback", to_step=step, after_consecutive=self.consecutive)
            self.consecutive = 0

    def on_end(self, trainer: Trainer) -> None:
        pass
