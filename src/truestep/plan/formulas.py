"""The closed forms a simulated optimum is compared with: Young's and Daly's checkpoint intervals and
Daly's expected wall-clock time.

- Young (1974): τ = sqrt(2 δ M), first order in δ/M.
- Daly (2006, "A higher order estimate of the optimum checkpoint interval for restart dumps"):
  τ = sqrt(2 δ M) [1 + (1/3) sqrt(δ / 2M) + (1/9) (δ / 2M)] − δ for δ < 2M, else M; and the expected
  wall time of T_s seconds of work, T_w(τ) = M e^{R/M} (e^{(τ + δ)/M} − 1) T_s / τ.

δ is the time one checkpoint costs the job, M the mean time between failures of the whole job, R the
time a restart costs (all of it exposed to further failures). Their assumptions -- exponential failures,
a checkpoint durable as soon as its cost is paid, failures during checkpoints and restarts -- are the
regime in which tests/test_plan.py checks the simulation against them.
"""

from __future__ import annotations

import math


def young_interval(delta_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * delta_s * mtbf_s)


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = delta_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * delta_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_s


def daly_wall(work_s: float, interval_s: float, delta_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's expected wall-clock time for `work_s` of work checkpointed every `interval_s`."""
    m = mtbf_s
    return m * math.exp(restart_s / m) * math.expm1((interval_s + delta_s) / m) * work_s / interval_s


def daly_optimum(delta_s: float, restart_s: float, mtbf_s: float) -> float:
    """The interval minimizing `daly_wall` exactly (golden-section search in log τ), for comparing with a
    simulated optimum without the series truncation of `daly_interval`."""
    lo, hi = math.log(max(1e-9, delta_s * 1e-3, mtbf_s * 1e-6)), math.log(mtbf_s * 10.0)
    golden = (math.sqrt(5.0) - 1.0) / 2.0

    def waste(log_tau: float) -> float:
        return daly_wall(1.0, math.exp(log_tau), delta_s, restart_s, mtbf_s)

    a, b = lo, hi
    for _ in range(200):
        c, d = b - golden * (b - a), a + golden * (b - a)
        if waste(c) < waste(d):
            b = d
        else:
            a = c
    return math.exp((a + b) / 2.0)
