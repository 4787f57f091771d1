"""The training loop's hooks: thin adapters, one mechanism each, between the loop and the rooms below.

The mechanisms live in their rooms and never see a Trainer (checkpoint saving in checkpoint/, signal
agreement and timeouts in resilience/, logs in telemetry/); a hook sees the run through a `StepView` and
hands each mechanism exactly what it needs. The order in which hooks run is `Slot`'s (base.py); the
resume self-check's hooks are train/selfcheck/.
"""

from truestep.train.hooks.base import Hook, Slot
from truestep.train.hooks.checkpointing import CheckpointHook
from truestep.train.hooks.evaluation import EvalHook
from truestep.train.hooks.metrics import MetricsHook
from truestep.train.hooks.nan_guard import NanGuardHook
from truestep.train.hooks.preemption import PreemptionHook
from truestep.train.hooks.timeouts import CollectiveTimeoutHook

__all__ = [
    "CheckpointHook",
    "CollectiveTimeoutHook",
    "EvalHook",
    "Hook",
    "MetricsHook",
    "NanGuardHook",
    "PreemptionHook",
    "Slot",
]
