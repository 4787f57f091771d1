"""NaN guard policy: the trainer skips non-finite updates (agreed: loss and grad norm are global);
after K consecutive skips the run rolls back to the newest verified checkpoint, and a divergence that
recurs after rolling back to the same step stops the run instead of looping forever."""

from __future__ import annotations


class NanGuard:
    def __init__(self, rollback_after: int) -> None:
        self.rollback_after = rollback_after
        self.consecutive = 0
        self.rolled_back_to: set[int] = set()

    def observe(self, skipped: bool) -> bool:
        """Count a step; True when it is time to roll back."""
        self.consecutive = self.consecutive + 1 if skipped else 0
        return bool(self.rollback_after) and self.consecutive >= self.rollback_after

    def rolled_back(self, step: int) -> None:
        if step in self.rolled_back_to:
            raise RuntimeError(
                f"non-finite steps recurred after rolling back to step {step}: the divergence is "
                "deterministic (data or hyperparameters), so another rollback would loop forever"
            )
        self.rolled_back_to.add(step)
        self.consecutive = 0
