"""Fault injection: declarative specs and campaigns (`spec.py`), fault points and their actions
(`hooks.py`). Inert when no fault is configured; only code at a fault point imports it."""

from truestep.faults.hooks import arm, armed, fault_point, poison_loss, set_context
from truestep.faults.spec import (
    FaultSpec,
    FaultSpecError,
    campaign,
    parse_fault,
    parse_faults,
)

__all__ = [
    "FaultSpec",
    "FaultSpecError",
    "arm",
    "armed",
    "campaign",
    "fault_point",
    "parse_fault",
    "parse_faults",
    "poison_loss",
    "set_context",
]
