"""The Monte Carlo core: many replicas of one long job, vectorized over replicas with numpy.

A replica alternates *up periods* (processes running: start-up, restore, training with periodic
checkpoints) and *recoveries* (detection, teardown, relaunch or requeue wait). Failures arrive as a
Poisson process on the wall clock whenever the job holds its nodes: up periods, and in a recovery the
detection, the teardown, a graceful stop and a relaunch in place; not while it waits for the scheduler
(a requeue or a replacement node: the allocation is released). A failure inside a recovery strikes the
relaunch (the next up period fails as it starts; more in the same recovery are counted and handled by
that relaunch), so a rate read from wall-clock counts of a job that held its nodes (Llama 3's 419 in 54 days) is simulated as such.
Preemption notices arrive while the job's processes run (a notice to a job that is down stops nothing).
The loop handles one up period of
every unfinished replica per iteration, in closed form (how far training got, which checkpoint was
committed, whether a save was torn), so its length is the largest number of interruptions any replica
saw, not the number of steps. Every parameter is an array with one value per replica, so one call
simulates many settings at once (a sweep puts its settings side by side); replicas `r`, `r + R`,
`r + 2R`, ... (R = `crn_width`) draw the same random numbers (common random numbers), so differences
between settings are not drowned in sampling noise. docs/plan.md states the model and its assumptions.

Time inside training is *training wall time*: a step costs `step_s` of compute plus its share of the
between-step overhead; `overhead_fraction` splits it back into useful time and `other` at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from truestep.analysis.goodput import BUCKETS
from truestep.config.errors import ConfigError

OUTCOMES = ("crash", "crash_node", "hang", "hang_node")
"""What one failure is: a crash or a hang, and whether it took its node out (needs a replacement)."""
SIM_BUCKETS = (*BUCKETS, "other")
"""The analysis's badput buckets (analysis/goodput.py) plus `other`; `unverifiable` stays 0 in a plan."""

Array = np.ndarray
SNAPSHOTS_OFF = {"snapshot_s": 0.0, "memory_restore_s": 0.0, "memory_fallback_p": 1.0}
"""The peer-snapshot parameters a caller may leave out (make_params): no snapshots."""


class SimulationTooLong(ConfigError):
    """A replica saw more interruptions than the caller allowed: refused in one line (exit 2)."""


@dataclass
class Params:
    """One value per replica (numpy arrays of equal length; `outcome_p` is (replicas, 4))."""

    work_s: Array
    """Failure-free training time of the whole job (useful compute, seconds)."""
    interval_s: Array
    """Training time between checkpoints (useful compute, seconds)."""
    step_s: Array
    """Useful compute of one step (0: continuous; otherwise a kill loses the cut-short step to `other`)."""
    overhead_fraction: Array
    """Between-step overhead (hooks, logging) per second of useful compute: counted as `other`."""
    blocking_s: Array
    """Training stalls this long per save (with async save: staging; without: the whole save)."""
    write_s: Array
    """Save start -> every shard written: a failure inside this window leaves a torn checkpoint."""
    commit_s: Array
    """Written -> committed (manifest, marker): only a committed checkpoint is resumed from."""
    restore_s: Array
    startup_cold_s: Array
    """Process start -> first step for a fresh launch (first attempt, requeue, replaced node)."""
    startup_warm_s: Array
    """Process start -> first step for a restart in place (a warm standby when it is on)."""
    detect_crash_s: Array
    detect_hang_s: Array
    teardown_s: Array
    restart_delay_s: Array
    """Failure handled -> relaunch in place (the supervisor restarts the ranks)."""
    requeue_delay_s: Array
    """Stop -> relaunch through the scheduler (preemption; node loss with a spare node)."""
    node_wait_s: Array
    """Extra wait for a node loss when no spare node is at hand (0 with spares)."""
    graceful_stop_s: Array
    """Preemption notice -> every rank exited, emergency save committed."""
    other_per_attempt_s: Array
    """Per attempt: shutdown and bookkeeping no other bucket covers."""
    failure_rate: Array
    """Failures per second of the job's up time (all nodes together)."""
    preempt_rate: Array
    """Preemption notices per second of up time."""
    notice_s: Array
    outcome_p: Array
    """Probabilities of OUTCOMES, (replicas, 4), rows summing to 1."""
    corrupt_hard: Array
    """A resume from an interval checkpoint after a crash/hang/kill leaves the reference trajectory."""
    corrupt_graceful: Array
    """A resume from a preemption's emergency checkpoint leaves the reference trajectory."""
    trust_newest: Array
    """Atomic commit off: the newest checkpoint directory is resumed from even if it is not committed."""
    corrupt_torn: Array
    """Resuming a torn checkpoint (atomic commit off, a failure while a save was written) leaves the
    reference trajectory."""
    snapshot_s: Array
    """Useful compute between peer snapshots (k steps; 0: off). A hard failure restores the last agreed
    snapshot (agreed one step after it was taken) from memory, unless it falls back to disk."""
    memory_restore_s: Array
    """Restore from peers' memory (instead of restore_s) on the attempt after a recovery from memory."""
    memory_fallback_p: Array
    """Probability that a failure's recovery cannot use memory (its buddies lost too)."""

    @property
    def size(self) -> int:
        return int(self.work_s.shape[0])


def make_params(replicas: int, outcome_p: Array | list[float], **values: float | Array) -> Params:
    """Params with every scalar broadcast to `replicas` (arrays must already have that length)."""
    out: dict[str, Array] = {}
    for f in fields(Params):
        if f.name == "outcome_p":
            p = np.asarray(outcome_p, dtype=float)
            out[f.name] = np.broadcast_to(p, (replicas, len(OUTCOMES))).copy()
            continue
        dtype = (
            bool if f.name in ("corrupt_hard", "corrupt_graceful", "trust_newest", "corrupt_torn") else float
        )
        value = values[f.name] if f.name in values or f.name not in SNAPSHOTS_OFF else SNAPSHOTS_OFF[f.name]
        out[f.name] = np.broadcast_to(np.asarray(value, dtype=dtype), (replicas,)).copy()
    return Params(**out)


def concat(params: list[Params]) -> Params:
    """Settings side by side (the first setting's replicas first)."""
    return Params(**{f.name: np.concatenate([getattr(p, f.name) for p in params]) for f in fields(Params)})


@dataclass
class SimResult:
    wall_s: Array
    work_s: Array
    """Useful compute of the final trajectory (= Params.work_s)."""
    correct_s: Array
    """Useful compute on the reference trajectory (before the first corrupted resume)."""
    badput_s: dict[str, Array]
    """SIM_BUCKETS -> seconds per replica; useful + after_violation + Σ the rest = wall."""
    failures: Array
    preemptions: Array
    recovery_s: Array
    """Σ detection + teardown + relaunch wait + start-up + restore over the job's recoveries."""
    hard_stops: Array | None = None
    """Interruptions that lost work: failures and preemptions that killed the job (per replica)."""
    from_memory: Array | None = None
    """Of those, the ones restored from peers' memory."""

    def part(self, where: slice) -> SimResult:
        """The replicas of one setting of a side-by-side run."""
        cut = {f.name: getattr(self, f.name) for f in fields(self)}
        return SimResult(
            **{
                k: (
                    {b: x[where] for b, x in v.items()}
                    if isinstance(v, dict)
                    else None
                    if v is None
                    else v[where]
                )
                for k, v in cut.items()
            }
        )

    @property
    def plain_goodput(self) -> Array:
        """Fraction of wall-clock spent on steps of the final trajectory."""
        return self.work_s / self.wall_s

    @property
    def correct_goodput(self) -> Array:
        """Fraction of wall-clock spent on steps that are on the reference trajectory."""
        return self.correct_s / self.wall_s


def simulate(
    p: Params, seed: int, crn_width: int | None = None, max_iterations: int = 10_000_000
) -> SimResult:
    """Run every replica to the end of its job. `crn_width`: replicas that share random numbers repeat
    every this many (default: all replicas draw independently)."""
    n = p.size
    width = crn_width or n
    if n % width:
        raise ValueError(f"{n} replicas are not a multiple of the common-random-number width {width}")
    rng = np.random.default_rng(seed)
    scale = 1.0 + p.overhead_fraction  # training wall per second of useful compute
    work, tau, step = p.work_s * scale, p.interval_s * scale, p.step_s * scale
    b_eff = np.maximum(p.blocking_s, p.write_s + p.commit_s - tau)  # a save waits for the previous one
    cycle = tau + b_eff
    save_total = np.maximum(p.blocking_s, p.write_s + p.commit_s)

    snap = p.snapshot_s * scale
    snapshots = bool((snap > 0).any())  # draws an extra number per interruption only then (seeded plans)
    memory, hard_stops, from_memory = np.zeros(n, dtype=bool), np.zeros(n), np.zeros(n)
    t, pos = np.zeros(n), np.zeros(n)
    cold = np.ones(n, dtype=bool)
    violated = np.full(n, np.inf)
    bucket = {k: np.zeros(n) for k in SIM_BUCKETS}
    failures, preemptions, recovery, attempts = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    down = np.zeros(n)  # the nodes-held part of each replica's last recovery: failures arrive there too
    active = np.arange(n)
    cum_p = np.cumsum(p.outcome_p, axis=1)

    for _ in range(max_iterations):
        if active.size == 0:
            break
        e_fail, e_pre, u = rng.standard_exponential(width), rng.standard_exponential(width), rng.random(width)
        i, k = active, active % width
        rem = work[i] - pos[i]
        start = np.where(cold[i], p.startup_cold_s[i], p.startup_warm_s[i])
        rest = np.where(pos[i] > 0, np.where(memory[i], p.memory_restore_s[i], p.restore_s[i]), 0.0)
        up = start + rest
        saves = np.maximum(np.ceil(rem / tau[i] - 1e-9), 1.0)  # interval saves + the final save
        final_at = rem + (saves - 1) * b_eff[i]  # training time at which the final save starts
        end = up + final_at + save_total[i]
        with np.errstate(divide="ignore"):
            # Memoryless: the next failure after the previous recovery began; one due inside it strikes
            # the relaunch at once, and the others inside it are handled by that same relaunch.
            first = np.where(p.failure_rate[i] > 0, e_fail[k] / p.failure_rate[i], np.inf)
        fail_at = np.maximum(first - down[i], 0.0)
        more = p.failure_rate[i] * np.maximum(down[i] - first, 0.0)
        if more.any():
            failures[i] += rng.poisson(more)
        with np.errstate(divide="ignore"):
            notice_at = np.where(p.preempt_rate[i] > 0, e_pre[k] / p.preempt_rate[i], np.inf)
        # Ranks stop at a step boundary: a notice during start-up or restore is acted on once they are up.
        stop_at = np.maximum(notice_at, up)
        graceful_ok = p.notice_s[i] >= np.maximum(up - notice_at, 0.0) + p.graceful_stop_s[i]
        kill_at = np.where(graceful_ok, stop_at, notice_at + p.notice_s[i])  # a short notice is a kill
        first = np.minimum(fail_at, kill_at)
        done = end <= first
        graceful = ~done & (kill_at < fail_at) & graceful_ok
        hard = ~done & ~graceful
        preempt_kill = hard & (kill_at < fail_at)
        x = np.where(done, end, first)

        # Where the up period ended: start-up, restore, or training at time `a`.
        a = np.maximum(x - up, 0.0)
        in_final = a >= final_at
        whole = np.floor(a / cycle[i])
        computed = np.where(
            in_final, rem, np.minimum(whole * tau[i] + np.minimum(a - whole * cycle[i], tau[i]), rem)
        )
        in_final_s = np.where(in_final, a - final_at, 0.0)
        blocked = a - computed - in_final_s
        last_save = saves - 1  # interval saves only; the final one commits at `end`
        committed = np.clip(np.floor((a + b_eff[i] - p.write_s[i] - p.commit_s[i]) / cycle[i]), 0, last_save)
        started = np.clip(np.floor((a + b_eff[i]) / cycle[i]), 0, last_save)
        newest = np.where(in_final, rem, started * tau[i])  # the newest checkpoint directory
        newest_written_at = np.where(in_final, final_at, started * cycle[i] - b_eff[i]) + p.write_s[i]
        torn = (newest > 0) & (a < newest_written_at)

        # The resume point: the newest committed checkpoint, or (atomic commit off) the newest directory.
        trust = p.trust_newest[i]
        rel = np.where(trust, newest, committed * tau[i])
        rel = np.where(graceful, computed, rel)
        if snapshots:  # the newer of the last agreed snapshot and the checkpoint serves
            agreed = (
                np.floor(np.maximum(computed - step[i], 0.0) / np.maximum(snap[i], 1e-300) + 1e-9) * snap[i]
            )
            kept = rng.random(width)[k] >= p.memory_fallback_p[i]
            memory[i] = hard & ~preempt_kill & (snap[i] > 0) & kept & (agreed > rel)
            rel = np.where(memory[i], agreed, rel)
        lost_raw = np.where(hard, computed - rel, 0.0)
        partial = np.where(step[i] > 0, np.mod(lost_raw + 1e-9 * step[i], np.maximum(step[i], 1e-300)), 0.0)
        partial = np.minimum(partial, lost_raw)

        outcome = np.minimum((u[k][:, None] > cum_p[i]).sum(axis=1), len(OUTCOMES) - 1)
        is_hang = (outcome >= 2) & ~preempt_kill
        node_lost = ((outcome == 1) | (outcome == 3)) & ~preempt_kill
        detect = np.where(is_hang, p.detect_hang_s[i], p.detect_crash_s[i])
        wait = np.where(
            preempt_kill | graceful,
            p.requeue_delay_s[i],
            np.where(node_lost, p.requeue_delay_s[i] + p.node_wait_s[i], p.restart_delay_s[i]),
        )
        detect, teardown = np.where(hard, detect, 0.0), np.where(hard, p.teardown_s[i], 0.0)
        wait = np.where(done, 0.0, wait)
        stop = np.where(graceful, p.graceful_stop_s[i], 0.0)

        bucket["startup"][i] += np.minimum(x, start)
        bucket["restore"][i] += np.clip(x - start, 0.0, rest)
        bucket["checkpoint_blocking"][i] += blocked + np.minimum(in_final_s, p.blocking_s[i])
        bucket["checkpoint_blocking"][i] += np.minimum(stop, p.blocking_s[i])  # the emergency save
        bucket["lost_work"][i] += lost_raw - partial
        bucket["detection"][i] += detect
        bucket["teardown"][i] += teardown
        bucket["requeue_wait"][i] += wait
        bucket["other"][i] += (
            partial
            + np.maximum(in_final_s - p.blocking_s[i], 0.0)
            + np.maximum(stop - p.blocking_s[i], 0.0)
            + p.other_per_attempt_s[i]
        )
        recovery[i] += np.where(done, 0.0, detect + teardown + wait + stop) + np.where(
            attempts[i] > 0, up, 0.0
        )
        attempts[i] += 1
        t[i] += x + detect + teardown + wait + stop + p.other_per_attempt_s[i]
        in_place = ~(preempt_kill | graceful | node_lost)  # a relaunch in place keeps the nodes
        down[i] = detect + teardown + np.where(in_place, wait, 0.0) + stop + p.other_per_attempt_s[i]

        new_pos = pos[i] + np.where(done, rem, rel)
        corrupted = ~done & (new_pos > 0)
        corrupted &= np.where(graceful, p.corrupt_graceful[i], p.corrupt_hard[i]) | (
            trust & torn & hard & p.corrupt_torn[i]
        )
        violated[i] = np.where(corrupted, np.minimum(violated[i], new_pos), violated[i])
        pos[i] = new_pos
        cold[i] = node_lost | graceful | preempt_kill
        failures[i] += hard & ~preempt_kill
        hard_stops[i] += hard
        from_memory[i] += memory[i]
        preemptions[i] += graceful | preempt_kill
        # A graceful stop inside the final save has saved everything: the job is over.
        finished = done | (graceful & (new_pos >= work[i] - 1e-9))
        active = i[~finished]
    else:
        raise SimulationTooLong(
            f"the simulation did not finish within {max_iterations} interruptions of one replica: the job "
            "makes (almost) no progress at this setting (plan/budget.py)"
        )

    correct = np.minimum(violated, work)
    bucket["after_violation"] = (work - correct) / scale
    useful = correct / scale
    # Training wall is useful compute plus between-step overhead: the overhead is `other`.
    extra = (work + bucket["lost_work"]) * (1.0 - 1.0 / scale)
    bucket["lost_work"] = bucket["lost_work"] / scale
    bucket["other"] = bucket["other"] + extra
    return SimResult(
        t, p.work_s.copy(), useful, bucket, failures, preemptions, recovery, hard_stops, from_memory
    )
