"""The training loop's hooks: thin adapters, one mechanism each, between the loop and the rooms below.

The mechanisms live in their rooms and never see a Trainer (checkpoint saving in checkpoint/, signal
agreement and timeouts in resilience/, logs in telemetry/); a hook hands each one exactly the state it
needs. Order matters: the checkpoint hook restores first, so the others report the restored state.
"""

from truestep.train.hooks.base import Hook
from truestep.train.hooks.checkpointing import CheckpointHook
from truestep.train.hooks.evaluation import EvalHook
from truestep.train.hooks.metrics import MetricsHook
from truestep.train.hooks.nan_guard import NanGuardHook
from truestep.train.hooks.preemption import PreemptionHook
from truestep.train.hooks.resume_check import ResumeCheckHook
from truestep.train.hooks.timeouts import CollectiveTimeoutHook
from truestep.train.hooks.witness import WitnessHook

__all__ = [
    "CheckpointHook",
    "CollectiveTimeoutHook",
    "EvalHook",
    "Hook",
    "MetricsHook",
    "NanGuardHook",
    "PreemptionHook",
    "ResumeCheckHook",
    "WitnessHook",
]
