"""`truestep plan` on peer snapshots (issue 36 item 4): what a snapshot every k steps costs (a stall per
snapshot), what it buys (a failure restores from memory, losing at most k steps, in the memory restore's
time), when it cannot (the buddies lost too, a preemption that kills the job), the costs fitted from a
run's events, and the inputs refused like every other plan input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from test_plan import hand_made_run
from truestep.cli.main import main
from truestep.config.errors import ConfigError
from truestep.plan.build import assemble
from truestep.plan.fit import measure
from truestep.plan.inputs import PlanInputs, Provenance, apply_user
from truestep.plan.report import snapshot_blocks
from truestep.plan.scenario import params
from truestep.plan.simulate import SimResult, concat, simulate
from truestep.plan.study import make_plan

REPLICAS = 300
STEP_S = 10.0
INTERVAL_STEPS = 100


def job(k: int, fallback: float = 0.0) -> PlanInputs:
    """One node of 8 GPUs, 20,000 steps of 10 s, a crash about every 5,000 steps (no hangs, no node
    losses), a checkpoint every 100 steps; snapshots every k steps whose capture the step hides."""
    i = PlanInputs()
    i.job.gpus = i.job.gpus_per_node = 8
    i.job.work_steps, i.job.step_time_s = 20_000, STEP_S
    i.failures.gpu_mtbf_hours = 8 * 50_000 / 3600
    i.failures.hang_fraction = i.failures.node_loss_fraction = 0.0
    i.failures.memory_fallback_fraction = fallback
    i.costs.snapshot_capture_s, i.costs.snapshot_agree_s = 1.0, 0.0
    i.mechanisms.snapshot_every_steps = k
    return i


def side_by_side(*settings: PlanInputs) -> list[SimResult]:
    p = concat([params(s, REPLICAS, INTERVAL_STEPS * STEP_S) for s in settings])
    res = simulate(p, seed=3, crn_width=REPLICAS)
    return [res.part(slice(n * REPLICAS, (n + 1) * REPLICAS)) for n in range(len(settings))]


def lost_per_stop(r: SimResult) -> float:
    assert r.hard_stops is not None
    return float(r.badput_s["lost_work"].sum()) / STEP_S / float(r.hard_stops.sum())


def test_a_failure_loses_at_most_k_steps_from_memory_and_half_an_interval_from_disk() -> None:
    off, one, five = side_by_side(job(0), job(1), job(5))
    assert off.hard_stops is not None and off.hard_stops.sum() > 500  # enough failures to average
    assert 45 < lost_per_stop(off) < 55  # the disk: half of 100 steps
    # k = 1: one step (none when the failure hits the first step after a restart)
    assert 0.9 < lost_per_stop(one) <= 1.0
    # k = 5: a failure during step s+j of a snapshot taken at s loses j-1 steps, or 5 when j = 1: mean 3
    assert 2.7 < lost_per_stop(five) < 3.3
    assert one.from_memory is not None and off.from_memory is not None
    assert off.from_memory.sum() == 0 and one.from_memory.sum() / one.hard_stops.sum() > 0.99
    assert one.correct_goodput.mean() > off.correct_goodput.mean()


def test_when_memory_cannot_serve_the_disk_does_exactly_as_without_snapshots() -> None:
    """Every failure falls back (buddies always lost) and snapshots cost nothing here: the job is the
    job without snapshots, replica for replica."""
    off, never = side_by_side(job(0), job(1, fallback=1.0))
    assert never.from_memory is not None and never.from_memory.sum() == 0
    assert np.array_equal(off.wall_s, never.wall_s) and np.array_equal(off.correct_s, never.correct_s)


def test_a_preemption_that_kills_the_job_restores_from_disk() -> None:
    settings = [job(1)]
    settings[0].failures.gpu_mtbf_hours = 1e12  # no failures
    settings[0].failures.preemptions_per_day, settings[0].failures.preemption_notice_s = 20.0, 0.0
    [r] = side_by_side(*settings)
    assert r.hard_stops is not None and r.from_memory is not None
    assert r.hard_stops.sum() > 100 and r.from_memory.sum() == 0


def test_a_recovery_from_memory_takes_the_memory_restore_time() -> None:
    off, on = job(0), job(1)
    for s in (off, on):
        s.costs.restore_s, s.costs.memory_restore_s = 100.0, 1.0
    r_off, r_on = side_by_side(off, on)
    assert r_on.badput_s["restore"].sum() < 0.02 * r_off.badput_s["restore"].sum()


def test_snapshots_stall_training_by_what_the_step_does_not_hide() -> None:
    hidden, slow = job(2), job(2)
    slow.costs.snapshot_capture_s, slow.costs.snapshot_agree_s = 13.0, 0.5  # 3 s past the 10 s step
    p_hidden, p_slow = params(hidden, 2, 1000.0), params(slow, 2, 1000.0)
    assert p_hidden.overhead_fraction[0] == pytest.approx(0.0)
    assert p_slow.overhead_fraction[0] == pytest.approx((3.0 + 0.5) / 2 / STEP_S)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["--mechanisms.snapshot_every_steps=2"], "needs job.step_time_s > 0"),
        (["--failures.memory_fallback_fraction=1.5"], "memory_fallback_fraction must be within [0, 1]"),
        (["--failures.memory_fallback_fraction=nan"], "failures.memory_fallback_fraction"),
        (["--costs.snapshot_capture_s=inf"], "costs.snapshot_capture_s"),
        (["--costs.memory_restore_s=-1"], "costs.memory_restore_s"),
        (["--costs.snapshot_agree_s=nan"], "costs.snapshot_agree_s"),
        (["--scaling.network_gbps_per_rank=0"], "network_gbps_per_rank must be > 0"),
    ],
)
def test_bad_snapshot_inputs_are_refused_with_one_line(overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        apply_user(PlanInputs(), Provenance(), None, overrides)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_command_refuses_snapshots_without_a_step_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--mechanisms.snapshot_every_steps=1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "snapshot_every_steps needs job.step_time_s" in err[0]


def test_snapshot_costs_are_fitted_from_the_runs_events(tmp_path: Path) -> None:
    """The run of test_plan's fit test, with a snapshot agreed after each of steps 1-5 and a memory
    restore: the capture and agreement per snapshot, the restore from memory; the update's waits come
    out of the step time and the agreements out of the between-step overhead."""
    run = tmp_path / "run"
    hand_made_run(run)
    plain = measure(run)
    extra = [
        {"time": 1.5 + s, "event": "snapshot_agreed", "attempt": 0, "step": s, "capture_s": 0.3}
        | {"replicate_s": 0.2, "blocked_s": 0.05, "wait_s": 0.1, "bytes": 1000}
        for s in range(1, 6)
    ]
    extra.append({"time": 10.0, "event": "memory_restore", "attempt": 1, "step": 5, "restore_s": 0.2})
    with open(run / "events.jsonl", "a") as f:
        f.write("".join(json.dumps(e) + "\n" for e in extra))
    m = measure(run)
    assert m.values["costs.snapshot_capture_s"] == pytest.approx(0.3)
    assert m.values["costs.snapshot_agree_s"] == pytest.approx(0.05)
    assert m.values["costs.memory_restore_s"] == pytest.approx(0.2)
    steps = 10  # the run's final trajectory
    assert m.values["job.step_time_s"] == pytest.approx(plain.values["job.step_time_s"] - 5 * 0.1 / steps)
    assert m.values["job.step_overhead_s"] == pytest.approx(
        max(0.0, plain.values["job.step_overhead_s"] - 5 * 0.05 / steps)
    )
    assert any("took peer snapshots (5 agreed)" in note for note in m.notes), m.notes
    assert "costs.snapshot_capture_s" not in plain.values  # a run without snapshots shows none


def test_the_plan_says_what_snapshots_buy_at_every_size() -> None:
    a = assemble(None, None, ["--job.step_time_s=5", "--job.job_days=3", "--job.replicas=20"])
    result = make_plan(a, sweep_replicas=10)
    study = result.snapshots
    assert study is not None and [r.k for r in study.rows] == [0, 1, 10]
    off, one, ten = study.rows
    assert off.from_memory == 0 and one.from_memory > 0.5 and one.steps_lost < off.steps_lost
    assert set(study.sweep) == {0, 1, 10} and len(study.sweep[1]) == len(study.sweep_gpus) == 12
    assert all(math.isfinite(x) for x in study.sweep_lost[1])
    text = " ".join(str(b) for b in snapshot_blocks(study, 5.0))
    assert "every 10 steps" in text and "steps lost per failure" in text
    without = make_plan(assemble(None, None, ["--job.job_days=3", "--job.replicas=20"]), sweep_replicas=10)
    assert without.snapshots is None
    assert "Not simulated" in " ".join(str(b) for b in snapshot_blocks(None, 0.0))
