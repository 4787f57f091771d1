"""Fault injection: named fault points, armed by a declarative spec, inert when none is configured."""

from truestep.faults.hooks import FaultSpec, arm, armed, fault_point, parse_faults, poison_loss

__all__ = ["FaultSpec", "arm", "armed", "fault_point", "parse_faults", "poison_loss"]
