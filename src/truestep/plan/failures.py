"""What interrupts a job: the failure rate of the whole job and the kinds of failure (plan/simulate.py's
OUTCOMES: crash or hang, node lost or not).

Failures arrive per node as exponential (Poisson) processes, so the job sees a Poisson process with the
sum of the node rates; a node that fails is replaced by one with the same rate. The `llama3` model takes
its rate and its mix from the Llama 3 report (Dubey et al. 2024, Table 5: 419 unexpected interruptions
of a 16,384-GPU job over a 54-day snapshot; 47 planned interruptions besides, which are not failures).
The report gives each interruption's root cause, not how it showed or whether the node had to go:
`LLAMA3_INTERRUPTIONS` marks that per cause as *truestep's assumption* (docs/plan.md says so).
"""

from __future__ import annotations

import math

from truestep.plan.inputs import FailureInputs

LLAMA3_GPUS = 16384
LLAMA3_DAYS = 54.0
LLAMA3_PLANNED = 47
"""Planned interruptions of the same snapshot (maintenance, configuration changes): not failures."""

LLAMA3_INTERRUPTIONS: tuple[tuple[str, int, bool, bool], ...] = (
    # (root cause as the report names it, count, hangs?, takes its node out?) -- the two flags assumed
    ("Faulty GPU", 148, False, True),
    ("GPU HBM3 Memory", 72, False, True),
    ("Software Bug", 54, False, False),
    ("Network Switch/Cable", 35, True, True),
    ("Host Maintenance", 32, False, True),
    ("GPU SRAM Memory", 19, False, True),
    ("GPU System Processor", 17, True, True),
    ("NIC", 7, True, True),
    ("NCCL Watchdog Timeouts", 7, True, False),
    ("Silent Data Corruption", 6, False, True),
    ("GPU Thermal Interface + Sensor", 6, False, True),
    ("SSD", 3, False, True),
    ("Power Supply", 3, False, True),
    ("Server Chassis", 2, False, True),
    ("IO Expansion Board", 2, False, True),
    ("Dependency", 2, False, False),
    ("CPU", 2, False, True),
    ("System Memory", 2, False, True),
)


def llama3_total() -> int:
    return sum(count for _, count, _, _ in LLAMA3_INTERRUPTIONS)


def llama3_gpu_mtbf_hours() -> float:
    """GPU-hours of the snapshot per unexpected interruption (16,384 x 54 days / 419 = 50,677 h)."""
    return LLAMA3_GPUS * LLAMA3_DAYS * 24.0 / llama3_total()


def llama3_outcomes() -> list[float]:
    """Probabilities of (crash, crash + node lost, hang, hang + node lost) over the 419 interruptions."""
    total = llama3_total()
    p = [0.0, 0.0, 0.0, 0.0]
    for _, count, hangs, node in LLAMA3_INTERRUPTIONS:
        p[2 * hangs + node] += count / total
    return p


def outcome_probabilities(f: FailureInputs) -> list[float]:
    if f.model == "llama3":
        return llama3_outcomes()
    h, n = f.hang_fraction, f.node_loss_fraction
    return [(1 - h) * (1 - n), (1 - h) * n, h * (1 - n), h * n]


def gpu_mtbf_hours(f: FailureInputs) -> float:
    return llama3_gpu_mtbf_hours() if f.model == "llama3" else f.gpu_mtbf_hours


def job_failure_rate(f: FailureInputs, gpus: int, gpus_per_node: int) -> float:
    """Failures per second of the whole job: nodes x (GPUs per node / per-GPU MTBF)."""
    nodes = math.ceil(gpus / gpus_per_node)
    return nodes * gpus_per_node / (gpu_mtbf_hours(f) * 3600.0)
