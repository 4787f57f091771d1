"""The evaluation hook: every eval.every_steps steps, the held-out loss and perplexity
(train/evaluation.py) into events.jsonl (`eval`), the console, TensorBoard and W&B."""

from __future__ import annotations

from typing import TYPE_CHECKING

from truestep.telemetry.tensorboard import ScalarSinks
from truestep.train.evaluation import Evaluator
from truestep.train.hooks.base import Hook, Slot

if TYPE_CHECKING:
    from truestep.train.restorer import Start
    from truestep.train.trainer import StepResult
    from truestep.train.view import StepView


class EvalHook(Hook):
    slot = Slot.EVAL

    def __init__(self, sinks: ScalarSinks) -> None:
        self.sinks = sinks  # TensorBoard and W&B get the scalars too
        self.evaluator: Evaluator | None = None

    def on_start(self, view: StepView, start: Start) -> None:
        if view.cfg.eval.every_steps:
            self.evaluator = Evaluator(view.cfg, view.ctx, view.cfg.model.vocab_size)

    def after_step(self, view: StepView, result: StepResult) -> None:
        step = view.step
        if self.evaluator is None or step % view.cfg.eval.every_steps:
            return
        found = self.evaluator.evaluate(view.model)
        view.logs.event(
            "eval",
            step=step,
            loss=found.loss,
            perplexity=found.perplexity,
            tokens=found.tokens,
            samples=view.cfg.eval.samples,
            path=view.cfg.eval.path,
            eval_s=found.seconds,
        )
        self.sinks.scalars(step, {"eval/loss": found.loss, "eval/perplexity": found.perplexity})
