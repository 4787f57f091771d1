"""What a plan can compute: every setting is sized before it is simulated, and one the simulation cannot
finish in bounded time is refused in one line (ConfigError, exit 2) instead of running for hours.

The simulation handles one interruption of every unfinished replica per iteration (plan/simulate.py), so
its work is the number of interruptions a replica sees. That number is known in expectation before
anything runs, from Daly's expected wall-clock time (plan/formulas.py) with every interruption counted
(failures and preemption notices) and a restart that costs the slower detection, the teardown, the
relaunch in place, a cold start-up and the restore (what a failure re-exposes; the scheduler's waits are
left out, so an estimate for a job that mostly waits for nodes is low, which the iteration cap covers):

    E[interruptions] = e^{R/M} (e^{(τ+δ)/M} − 1) · W/τ,    M = 1/(failure rate + preemption rate)

(τ the interval, δ what a save stalls, W the work, in training wall time). It is large when the job's
MTBF is short against a restart plus an interval plus a save (10^8 GPUs; a save longer than the MTBF),
or when the job is long against the MTBF; computed in logarithms, so it never overflows. A setting above
MAX_INTERRUPTIONS is refused where it is the job planned (the headline), naming the numbers; the sweeps
and tables around it (other intervals, GPU counts, mechanism variants, ±50 % inputs) leave such
settings out and say so in a note.
The replica counts are bounded too (plan/inputs.py MAX_REPLICAS), and the simulation stops with one line after
ITERATION_SLACK times the bound.
"""

from __future__ import annotations

import math

from truestep.config.errors import ConfigError
from truestep.plan.failures import job_failure_rate
from truestep.plan.inputs import PlanInputs
from truestep.plan.scenario import DAY_S, blocking_s, work_s

MAX_INTERRUPTIONS = 5000
"""Expected interruptions per replica of any setting simulated (about a minute for the whole plan on
2 cores at the bound)."""
ITERATION_SLACK = 20
"""The simulation gives up (one line) after this many times the bound: the tail of a replica's count."""


def _log_expm1(x: float) -> float:
    return x + math.log1p(-math.exp(-x)) if x > 30 else math.log(math.expm1(x))


def expected_interruptions(inputs: PlanInputs, interval_s: float) -> float:
    """Expected interruptions of one replica of `inputs` checkpointing every `interval_s` (inf when
    beyond any float)."""
    job, c, f = inputs.job, inputs.costs, inputs.failures
    rate = job_failure_rate(f, job.gpus, job.gpus_per_node) + f.preemptions_per_day / DAY_S
    if rate <= 0:
        return 0.0
    scale = 1.0 + (job.step_overhead_s / job.step_time_s if job.step_time_s > 0 else 0.0)
    work, tau = work_s(inputs) * scale, max(interval_s, 1e-300) * scale
    delta = max(blocking_s(inputs), c.save_write_s + c.save_commit_s - tau)
    hang = c.detect_hang_s if inputs.mechanisms.heartbeat else c.collective_timeout_s
    restart = max(c.detect_crash_s, hang) + c.teardown_s + c.restart_delay_s + c.startup_cold_s + c.restore_s
    tau = min(tau, work)
    log_e = restart * rate + _log_expm1((tau + delta) * rate) + math.log(work / tau)
    return math.exp(log_e) if log_e < 700 else math.inf


def fits(inputs: PlanInputs, interval_s: float) -> bool:
    """The simulation can finish this setting in bounded time."""
    return expected_interruptions(inputs, interval_s) <= MAX_INTERRUPTIONS


def check_setting(inputs: PlanInputs, interval_s: float, what: str) -> None:
    """Refuse a setting the simulation cannot finish in bounded time (module docstring)."""
    events = expected_interruptions(inputs, interval_s)
    if events <= MAX_INTERRUPTIONS:
        return
    rate = job_failure_rate(inputs.failures, inputs.job.gpus, inputs.job.gpus_per_node)
    mtbf = f"{1.0 / rate:.3g} s" if rate > 0 else "no failures"
    count = f"about {events:.3g}" if math.isfinite(events) else "more than 10^300"
    raise ConfigError(
        f"{what}: a replica would see {count} interruptions (job MTBF {mtbf} at {inputs.job.gpus} GPUs, "
        f"checkpoint interval {interval_s:.3g} s, {work_s(inputs) / DAY_S:.3g} days of work): more than "
        f"the {MAX_INTERRUPTIONS} the plan simulates per replica (the job makes little progress). Plan "
        "fewer GPUs, a higher MTBF, another interval, cheaper saves and restarts, or a shorter job"
    )
