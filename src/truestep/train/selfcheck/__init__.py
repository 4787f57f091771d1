"""Was this resume faithful? The one package that answers it, on the rank, without a reference run.

`SelfCheckHook` (hook.py) receives the restore's `Restored` value and judges the resume with the evidence
that applies: the restore's digest finding and the replay of the lost steps (evidence.py), the stop
witness of a graceful stop (witness.py, whose `StopWitnessHook` records it at the stop); `judge.py` alone
decides what the resume is called. `replay.py` is the pure step-by-step comparison.
"""

from truestep.train.selfcheck.hook import ResumeDivergedError, SelfCheckHook
from truestep.train.selfcheck.witness import StopWitnessHook

__all__ = ["ResumeDivergedError", "SelfCheckHook", "StopWitnessHook"]
