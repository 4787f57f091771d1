"""The evaluation hook: every eval.every_steps steps, the held-out loss and perplexity
(train/evaluation.py) into events.jsonl (`eval`), the console, TensorBoard and W&B."""

from __future__ import annotations

from typing import TYPE_CHECKING

from truestep.train.evaluation import Evaluator
from truestep.train.hooks.base import Hook
from truestep.train.hooks.metrics import MetricsHook

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer


class EvalHook(Hook):
    def __init__(self, metrics: MetricsHook) -> None:
        self.metrics = metrics  # its TensorBoard and W&B writers get the scalars too
        self.evaluator: Evaluator | None = None

    def on_start(self, trainer: Trainer) -> None:
        if trainer.cfg.eval.every_steps:
            self.evaluator = Evaluator(trainer.cfg, trainer.ctx, trainer.cfg.model.vocab_size)

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        step = trainer.state.step
        if self.evaluator is None or step % trainer.cfg.eval.every_steps:
            return
        found = self.evaluator.evaluate(trainer.model)
        trainer.logs.event(
            "eval",
            step=step,
            loss=found.loss,
            perplexity=found.perplexity,
            tokens=found.tokens,
            samples=trainer.cfg.eval.samples,
            path=trainer.cfg.eval.path,
            eval_s=found.seconds,
        )
        self.metrics.scalars(step, {"eval/loss": found.loss, "eval/perplexity": found.perplexity})
