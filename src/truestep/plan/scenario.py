"""From inputs to the simulation's parameters: what each mechanism switch means to the model, and the
variants the plan compares (every mechanism on, then each one off)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

from truestep.plan.failures import job_failure_rate, outcome_probabilities
from truestep.plan.formulas import daly_interval
from truestep.plan.inputs import MIN_INTERVAL_S, PlanInputs, corrupts
from truestep.plan.simulate import Params, make_params

DAY_S = 86400.0


def _off(**switches: bool | int) -> Callable[[PlanInputs], None]:
    def apply(inputs: PlanInputs) -> None:
        for name, value in switches.items():
            setattr(inputs.mechanisms, name, value)

    return apply


ALL_ON = _off(
    async_save=True,
    warm_standby=True,
    heartbeat=True,
    restore_optimizer_state=True,
    restore_rng_state=True,
    restore_data_position=True,
    atomic_commit=True,
)
VARIANTS: dict[str, Callable[[PlanInputs], None]] = {
    "all on": lambda i: None,
    "optimizer restore off": _off(restore_optimizer_state=False),
    "RNG restore off": _off(restore_rng_state=False),
    "data position off": _off(restore_data_position=False),
    "atomic commit off": _off(atomic_commit=False),
    "async save off": _off(async_save=False),
    "warm standby off": _off(warm_standby=False),
    "collective-timeout detection": _off(heartbeat=False),
}
"""Each applied to an all-on copy of the inputs (`variant`). `collective-timeout detection` is heartbeats
off: a hang is seen only when the collective timeout fires."""


def variant(inputs: PlanInputs, name: str) -> PlanInputs:
    out = copy.deepcopy(inputs)
    ALL_ON(out)
    VARIANTS[name](out)
    return out


def work_s(inputs: PlanInputs) -> float:
    job = inputs.job
    return job.work_steps * job.step_time_s if job.work_steps > 0 else job.job_days * DAY_S


def blocking_s(inputs: PlanInputs) -> float:
    """What one checkpoint stalls training: the staging with async save, the whole save without (a
    measured sync save's blocking also holds what precedes the write, e.g. the parameter digest)."""
    c = inputs.costs
    whole = c.save_write_s + c.save_commit_s
    return c.save_blocking_s if inputs.mechanisms.async_save else max(c.save_blocking_s, whole)


def interrupt_rate(inputs: PlanInputs) -> float:
    """Interruptions that lose work, per second of up time: failures, and preemptions whose notice is too
    short for a graceful stop."""
    rate = job_failure_rate(inputs.failures, inputs.job.gpus, inputs.job.gpus_per_node)
    if inputs.failures.preemption_notice_s < inputs.costs.graceful_stop_s:
        rate += inputs.failures.preemptions_per_day / DAY_S
    return rate


def daly_for(inputs: PlanInputs) -> float:
    """Daly's interval for these inputs, at least one save's write + commit (a shorter one only stalls),
    rounded (`round_interval`)."""
    c = inputs.costs
    rate = interrupt_rate(inputs)
    tau = daly_interval(blocking_s(inputs), 1.0 / rate) if rate > 0 else work_s(inputs)
    return round_interval(inputs, max(tau, c.save_write_s + c.save_commit_s))


def planned_interval(inputs: PlanInputs) -> float:
    """The interval the user set (in seconds or steps), 0 when the plan is to find it."""
    job = inputs.job
    if job.checkpoint_interval_steps > 0:
        return job.checkpoint_interval_steps * job.step_time_s
    return job.checkpoint_interval_s


def round_interval(inputs: PlanInputs, interval_s: float) -> float:
    """Whole steps when the step time is known (at least one step), else at least MIN_INTERVAL_S; capped
    at the whole job."""
    step = inputs.job.step_time_s
    whole = max(1, round(interval_s / step)) * step if step > 0 else max(interval_s, MIN_INTERVAL_S)
    return min(whole, work_s(inputs))


def params(inputs: PlanInputs, replicas: int, interval_s: float) -> Params:
    job, c, m, f = inputs.job, inputs.costs, inputs.mechanisms, inputs.failures
    off = {
        "optimizer_corrupts": not m.restore_optimizer_state,
        "rng_corrupts": not m.restore_rng_state,
        "data_position_corrupts": not m.restore_data_position,
        "atomic_commit_corrupts": not m.atomic_commit,
    }
    kinds: set[str] = set()
    for key, disabled in off.items():
        if disabled:
            kinds |= corrupts(getattr(m, key), f"mechanisms.{key}")
    return make_params(
        replicas,
        outcome_probabilities(f),
        work_s=work_s(inputs),
        interval_s=interval_s,
        step_s=job.step_time_s,
        overhead_fraction=(job.step_overhead_s + snapshot_overhead_s(inputs)) / job.step_time_s
        if job.step_time_s > 0
        else 0.0,
        blocking_s=blocking_s(inputs),
        write_s=c.save_write_s,
        commit_s=c.save_commit_s,
        restore_s=c.restore_s,
        startup_cold_s=c.startup_cold_s,
        startup_warm_s=c.startup_warm_s if m.warm_standby else c.startup_cold_s,
        detect_crash_s=c.detect_crash_s,
        detect_hang_s=c.detect_hang_s if m.heartbeat else c.collective_timeout_s,
        teardown_s=c.teardown_s,
        restart_delay_s=c.restart_delay_s,
        requeue_delay_s=c.requeue_delay_s,
        node_wait_s=0.0 if m.spare_nodes > 0 else c.node_replace_s,
        graceful_stop_s=c.graceful_stop_s,
        other_per_attempt_s=c.other_per_attempt_s,
        failure_rate=job_failure_rate(f, job.gpus, job.gpus_per_node),
        preempt_rate=f.preemptions_per_day / DAY_S,
        notice_s=f.preemption_notice_s,
        corrupt_hard="hard" in kinds,
        corrupt_graceful="graceful" in kinds,
        trust_newest=not m.atomic_commit,
        corrupt_torn="torn" in kinds,
        snapshot_s=m.snapshot_every_steps * job.step_time_s,
        memory_restore_s=c.memory_restore_s,
        memory_fallback_p=f.memory_fallback_fraction,
    )


def snapshot_stall_s(inputs: PlanInputs) -> float:
    """What one snapshot stalls training: the agreement, and the part of the capture the next step's
    forward and backward do not hide (the update waits for it)."""
    c = inputs.costs
    return c.snapshot_agree_s + max(0.0, c.snapshot_capture_s - inputs.job.step_time_s)


def snapshot_overhead_s(inputs: PlanInputs) -> float:
    """What peer snapshots add to every step on average: one stall per k steps (0 when off)."""
    k = inputs.mechanisms.snapshot_every_steps
    return snapshot_stall_s(inputs) / k if k > 0 else 0.0


def spares_warning(inputs: PlanInputs) -> str | None:
    """Spare nodes are assumed never to run out: say when the expected node losses during one
    replacement wait exceed them."""
    m, f, job = inputs.mechanisms, inputs.failures, inputs.job
    if m.spare_nodes <= 0:
        return None
    p = outcome_probabilities(f)
    losses = job_failure_rate(f, job.gpus, job.gpus_per_node) * (p[1] + p[3]) * inputs.costs.node_replace_s
    if losses <= m.spare_nodes:
        return None
    return (
        f"about {losses:.1f} nodes are lost per replacement wait ({inputs.costs.node_replace_s:.0f} s) but "
        f"only {m.spare_nodes} are spare: the plan assumes a spare is always at hand"
    )


def gpu_fraction(inputs: PlanInputs) -> float:
    """The job's GPUs over all it holds (spares included)."""
    job = inputs.job
    return job.gpus / (
        math.ceil(job.gpus / job.gpus_per_node) * job.gpus_per_node
        + inputs.mechanisms.spare_nodes * job.gpus_per_node
    )
