"""`truestep plan`: the simulation against Young's and Daly's closed forms in their regime, its
bookkeeping (every second of the wall clock in exactly one bucket), what each mechanism switch means to
it, the inputs (TOML, overrides, provenance, refusals), the cost fit from a hand-made run, the scaling
model, and the command end to end. All in-process, seconds each."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from analysis_cases import line, start, write_run
from truestep.analysis.report.format import fmt_pct
from truestep.cli.main import main
from truestep.config.errors import ConfigError
from truestep.config.load import load_config, to_toml
from truestep.plan import failures, formulas
from truestep.plan.build import assemble
from truestep.plan.fit import measure
from truestep.plan.inputs import PlanInputs, Provenance, apply_user, keys
from truestep.plan.scaling import CostModel, ScalingInputs, bandwidth_terms, latencies
from truestep.plan.scenario import params, round_interval
from truestep.plan.simulate import SIM_BUCKETS, make_params, simulate
from truestep.plan.study import interval_sweep

ROOT = Path(__file__).resolve().parents[1]


def daly_regime(**overrides: float) -> PlanInputs:
    """One node, exponential failures (M = 2 days), a blocking checkpoint of δ = 30 s durable when it
    ends, a restart of R = 600 s exposed to failures, nothing else: the assumptions of Young and Daly."""
    i = PlanInputs()
    i.job.gpus = i.job.gpus_per_node = 1
    i.job.job_days = 400.0
    i.failures.gpu_mtbf_hours = 48.0
    i.failures.hang_fraction = i.failures.node_loss_fraction = 0.0
    zero = ("save_commit_s", "restore_s", "startup_cold_s", "detect_crash_s", "detect_hang_s", "teardown_s")
    for name in (*zero, "restart_delay_s", "requeue_delay_s", "other_per_attempt_s"):
        setattr(i.costs, name, 0.0)
    i.costs.save_blocking_s = i.costs.save_write_s = 30.0
    i.costs.startup_warm_s = 600.0
    for key, value in overrides.items():
        setattr(i.costs, key, value)
    return i


def test_simulated_optimum_and_waste_match_young_and_daly_within_2_percent() -> None:
    inputs = daly_regime()
    delta, restart, mtbf = 30.0, 600.0, 48 * 3600.0
    sweep = interval_sweep(inputs, replicas=300)
    exact = formulas.daly_optimum(delta, restart, mtbf)
    for formula in (exact, formulas.daly_interval(delta, mtbf), formulas.young_interval(delta, mtbf)):
        assert abs(sweep.optimum_s / formula - 1) < 0.02, (sweep.optimum_s, formula)
    work = inputs.job.job_days * 86400
    for tau, plain in zip(sweep.intervals_s, sweep.plain, strict=True):
        waste_sim = 1 / plain - 1
        waste_daly = formulas.daly_wall(work, tau, delta, restart, mtbf) / work - 1
        assert abs(waste_sim / waste_daly - 1) < 0.02, (tau, waste_sim, waste_daly)


def test_daly_interval_is_close_to_the_exact_minimizer_of_his_wall() -> None:
    delta, restart, mtbf = 60.0, 300.0, 3600.0
    assert formulas.young_interval(delta, mtbf) == pytest.approx(math.sqrt(2 * 60 * 3600))
    assert formulas.daly_interval(delta, mtbf) == pytest.approx(
        formulas.daly_optimum(delta, restart, mtbf), rel=5e-3
    )
    assert formulas.daly_interval(3 * mtbf, mtbf) == mtbf


def rich(replicas: int = 400, **flags: bool) -> tuple[PlanInputs, dict]:
    """Everything at once: crashes, hangs, node losses, graceful and too-short preemptions, async saves
    with a torn window, whole steps with between-step overhead."""
    i = PlanInputs()
    i.job.gpus, i.job.work_steps, i.job.step_time_s, i.job.step_overhead_s = 4096, 5000, 2.0, 0.1
    i.job.replicas = replicas
    i.failures.preemptions_per_day = 24.0
    i.failures.gpu_mtbf_hours = 1000.0
    return i, flags


def run(i: PlanInputs, interval: float = 600.0, seed: int = 0, replicas: int = 400):
    return simulate(params(i, replicas, round_interval(i, interval)), seed)


@pytest.mark.parametrize("notice", [1000.0, 5.0])
def test_every_second_of_the_wall_clock_is_in_exactly_one_bucket(notice: float) -> None:
    i, _ = rich()
    i.failures.preemption_notice_s = notice
    i.mechanisms.atomic_commit = False
    i.mechanisms.restore_rng_state = False
    r = run(i)
    assert set(r.badput_s) == set(SIM_BUCKETS)
    total = r.correct_s + sum(r.badput_s.values())
    np.testing.assert_allclose(total, r.wall_s, rtol=1e-9)
    assert (r.failures > 0).all() and (r.preemptions > 0).any()
    assert all((v >= -1e-9).all() for v in r.badput_s.values())
    assert (r.badput_s["unverifiable"] == 0).all()


def test_same_seed_same_numbers_and_another_seed_other_numbers() -> None:
    i, _ = rich()
    a, b, c = run(i, seed=3), run(i, seed=3), run(i, seed=4)
    assert np.array_equal(a.wall_s, b.wall_s) and np.array_equal(a.correct_s, b.correct_s)
    assert not np.array_equal(a.wall_s, c.wall_s)


def test_all_on_every_trajectory_step_is_correct() -> None:
    i, _ = rich()
    r = run(i)
    assert np.array_equal(r.correct_s, r.work_s)
    assert (r.badput_s["after_violation"] == 0).all()


@pytest.mark.parametrize("switch", ["restore_optimizer_state", "restore_rng_state", "restore_data_position"])
def test_a_restore_switch_off_corrupts_the_first_resume_from_a_checkpoint(switch: str) -> None:
    i, _ = rich()
    setattr(i.mechanisms, switch, False)
    r = run(i)
    on = run(rich()[0])
    np.testing.assert_array_equal(r.wall_s, on.wall_s)  # the switch changes correctness, not time
    assert (r.correct_s < r.work_s).mean() > 0.99
    assert r.correct_goodput.mean() < 0.5 * on.correct_goodput.mean()


def test_corrupted_resumes_are_only_the_kinds_the_ablation_named() -> None:
    i, _ = rich()
    i.failures.preemptions_per_day = 0.0
    i.mechanisms.restore_optimizer_state = False
    i.mechanisms.optimizer_corrupts = "graceful"  # only preemptions' resumes: there are none
    r = run(i)
    assert np.array_equal(r.correct_s, r.work_s)
    i.mechanisms.optimizer_corrupts = "hard"
    assert (run(i).correct_s < r.work_s).any()


def test_atomic_commit_off_corrupts_only_resumes_from_torn_checkpoints() -> None:
    i, _ = rich()
    i.mechanisms.atomic_commit = False
    torn = run(i)
    assert (torn.correct_s < torn.work_s).any()
    # With an instant write nothing is ever torn: the newest directory is complete, trusting it is safe
    # (and loses less work than waiting for the commit).
    i.costs.save_blocking_s = i.costs.save_write_s = 0.0
    safe = run(i)
    assert np.array_equal(safe.correct_s, safe.work_s)
    i.mechanisms.atomic_commit = True
    committed = run(i)
    assert safe.badput_s["lost_work"].mean() < committed.badput_s["lost_work"].mean()


def test_performance_switches_cost_time_not_correctness() -> None:
    base = run(rich()[0])
    for switch in ("async_save", "warm_standby", "heartbeat"):
        i, _ = rich()
        setattr(i.mechanisms, switch, False)
        r = run(i)
        assert np.array_equal(r.correct_s, r.work_s)
        assert r.wall_s.mean() > base.wall_s.mean(), switch
    i, _ = rich()
    i.mechanisms.spare_nodes = 0
    assert run(i).badput_s["requeue_wait"].mean() > base.badput_s["requeue_wait"].mean()


def test_a_checkpoint_protects_work_only_once_committed() -> None:
    quick, _ = rich()
    slow, _ = rich()
    quick.costs.save_write_s, quick.costs.save_commit_s = 2.0, 0.0
    slow.costs.save_write_s, slow.costs.save_commit_s = 300.0, 200.0  # same stall, durable 500 s later
    a, b = run(quick, interval=600.0), run(slow, interval=600.0)
    # a failure in the 500 s before the commit loses the interval before it too: ~ +500 s x 500/600
    assert b.badput_s["lost_work"].mean() > 1.5 * a.badput_s["lost_work"].mean()


def test_a_lost_node_means_a_cold_start_with_or_without_a_standby() -> None:
    walls = []
    for standby in (True, False):
        i, _ = rich()
        i.failures.node_loss_fraction, i.failures.preemptions_per_day = 1.0, 0.0
        i.mechanisms.warm_standby = standby
        walls.append(run(i).wall_s)
    np.testing.assert_array_equal(walls[0], walls[1])


def test_a_job_without_failures_is_start_up_steps_saves_and_nothing_else() -> None:
    p = make_params(
        2, [1, 0, 0, 0], work_s=100.0, interval_s=30.0, step_s=0.0, overhead_fraction=0.0, blocking_s=1.0,
        write_s=2.0, commit_s=1.0, restore_s=5.0, startup_cold_s=7.0, startup_warm_s=1.0, detect_crash_s=0.0,
        detect_hang_s=0.0, teardown_s=0.0, restart_delay_s=0.0, requeue_delay_s=0.0, node_wait_s=0.0,
        graceful_stop_s=0.0, other_per_attempt_s=0.5, failure_rate=0.0, preempt_rate=0.0, notice_s=0.0,
        corrupt_hard=False, corrupt_graceful=False, trust_newest=False, corrupt_torn=False,
    )  # fmt: skip
    r = simulate(p, 0)
    # 7 start-up + 100 training + 3 interval saves x 1 s blocking + the final save (3 s to commit) + 0.5
    np.testing.assert_allclose(r.wall_s, 7 + 100 + 3 + 3 + 0.5)
    np.testing.assert_allclose(r.badput_s["checkpoint_blocking"], 4.0)
    np.testing.assert_allclose(r.badput_s["other"], 2.0 + 0.5)


def test_llama3_mix_is_the_reports_419_interruptions() -> None:
    assert failures.llama3_total() == 419
    assert failures.llama3_gpu_mtbf_hours() == pytest.approx(16384 * 54 * 24 / 419)
    p = failures.llama3_outcomes()
    assert sum(p) == pytest.approx(1.0) and min(p) > 0


def test_inputs_toml_then_overrides_with_provenance(tmp_path: Path) -> None:
    toml = tmp_path / "plan.toml"
    toml.write_text("[job]\ngpus = 512\njob_days = 10\n[costs]\nrestore_s = 42\n")
    i, prov = PlanInputs(), Provenance()
    apply_user(i, prov, toml, ["--job.gpus=1024", "--mechanisms.heartbeat=false"])
    assert (i.job.gpus, i.job.job_days, i.costs.restore_s, i.mechanisms.heartbeat) == (
        1024,
        10.0,
        42.0,
        False,
    )
    assert prov.kind("job.gpus") == "set" and prov.label("job.gpus") == "set on the command line"
    assert prov.label("costs.restore_s") == "set in plan.toml"
    assert prov.kind("costs.teardown_s") == "assumed"


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["--job.nope=1"], "unknown key job.nope"),
        (["--job.gpus=many"], "expected int"),
        (["--costs.restore_s=-1"], "must not be negative"),
        (["--failures.model=llama3", "--failures.gpu_mtbf_hours=10"], "do not also set gpu_mtbf_hours"),
        (["--failures.hang_fraction=2"], "within [0, 1]"),
        (["--mechanisms.rng_corrupts=soft"], "unknown resumes"),
        (["--job.work_steps=10"], "needs job.step_time_s"),
        # Issue 38: NaN passed every `< 0` check (100 % goodput, 0 failures, exit 0); inf never answered.
        (["--failures.gpu_mtbf_hours=nan"], "must be finite numbers: failures.gpu_mtbf_hours"),
        (["--failures.preemptions_per_day=nan"], "must be finite numbers: failures.preemptions_per_day"),
        (["--costs.save_write_s=inf", "--job.job_days=inf"], "must be finite numbers: job.job_days, costs"),
        (["--job.replicas=100000000"], "job.replicas must be within [2, 100000]"),
        (["--job.checkpoint_interval_s=1e-6"], "must be 0 (the plan finds it) or >= 1 s"),
    ],
)
def test_bad_inputs_are_refused_with_one_line(overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        apply_user(PlanInputs(), Provenance(), None, overrides)
    assert says in str(err.value)


def test_docs_list_every_input() -> None:
    text = (ROOT / "docs" / "plan.md").read_text()
    missing = [k for k in keys(PlanInputs()) if f"`{k}`" not in text]
    assert missing == [], f"docs/plan.md does not describe {missing}"


def test_scaling_model_reproduces_the_measurement_and_grows_with_bytes() -> None:
    s = ScalingInputs()
    measured = {
        "save_blocking_s": 0.5,
        "save_write_s": 3.0,
        "save_commit_s": 1.0,
        "restore_s": 4.0,
        "graceful_stop_s": 6.0,
    }
    lat, scale = latencies(s, measured, measured_params=1e9, measured_world=8)
    assert scale == {"save_commit_s": pytest.approx(1.0 / 1.5)}  # 1.5 GB hashed in 1 s: faster than assumed
    model = CostModel(s, 1e9, lat, scale)
    at_measured = model.at(8)
    for key, value in measured.items():
        assert at_measured[key] == pytest.approx(value), key
    big = CostModel(s, 70e9, lat, scale)
    assert big.at(8)["save_write_s"] > at_measured["save_write_s"]
    # Past the per-rank limit the aggregate bandwidth caps the write: more ranks stop helping.
    terms = [bandwidth_terms(s, 405e9, w)["save_write_s"] for w in (64, 100000)]
    assert terms[1] == pytest.approx(405e9 * 12 / (s.write_gbps_total * 1e9))
    assert CostModel(s, None, lat, scale, {"restore_s": 9.0}).at(10**5) == {"restore_s": 9.0}


def hand_made_run(path: Path) -> None:
    """Attempt 0 (process start 0) trains steps 1-6 (1 s each) with a save at step 5, is killed at 7.5,
    detected at 8.0, torn down by 8.7; the supervisor relaunches at 8.8; attempt 1 (a restart in place,
    process start 9.0) restores in 0.5 s by 10.0, trains steps 6-10 ending 11.5..15.5."""
    sup = {"source": "supervisor"}
    layout = {"layout": {"world_size": 2, "dp": 2, "tp": 1, "backend": "gloo"}}
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 7)] + [line(s, 1, 11.5 + s - 6) for s in range(6, 11)]
    events = [
        {"time": 0.0, "event": "supervisor_start", **sup},
        {"time": 0.0, "event": "attempt_start", "attempt": 0, **sup},
        start(0, 0.5, 0.0) | layout,
        {
            "time": 6.1,
            "event": "checkpoint_save",
            "attempt": 0,
            "step": 5,
            "reason": "interval",
            "blocking_s": 0.25,
        },
        {"time": 6.4, "event": "checkpoint_written", "attempt": 0, "step": 5, "write_s": 0.4},
        {"time": 6.5, "event": "checkpoint_commit", "attempt": 0, "step": 5, "commit_s": 0.1},
        {
            "time": 7.5,
            "event": "fault_injected",
            "kind": "kill",
            "step": 7,
            "rank": 1,
            "attempt": 0,
            "spec": "kill",
        },
        {
            "time": 8.0,
            "event": "failure_detected",
            "attempt": 0,
            "detected_at": 8.0,
            "kind": "process_exit",
            **sup,
        },
        {"time": 8.7, "event": "teardown_complete", "attempt": 0, "teardown_s": 0.7, **sup},
        {"time": 8.8, "event": "attempt_start", "attempt": 1, **sup},
        start(1, 9.5, 9.0) | layout,
        {"time": 10.0, "event": "checkpoint_restore", "attempt": 1, "step": 5, "restore_s": 0.5},
        {"time": 15.6, "event": "run_end", "attempt": 1, "step": 10},
    ]
    write_run(path, metrics, events)
    (path / "config.toml").write_text(to_toml(load_config("demo")))


def test_costs_are_fitted_from_the_analysis_of_a_run(tmp_path: Path) -> None:
    hand_made_run(tmp_path / "run")
    m = measure(tmp_path / "run")
    assert m.world == 2 and m.runs == 1 and m.params and m.params > 0
    want = {
        "job.step_time_s": 1.0,
        "costs.save_blocking_s": 0.25,
        "costs.save_write_s": 0.4,
        "costs.save_commit_s": 0.1,
        "costs.restore_s": 0.5,
        "costs.detect_crash_s": 0.5,  # fault 7.5 -> detected 8.0
        "costs.teardown_s": 0.7,  # detected 8.0 -> torn down 8.7
        "costs.startup_cold_s": 1.0,  # process start 0 -> first step's start 1.0
        "costs.restart_delay_s": 0.1,  # teardown done 8.7 -> the supervisor relaunches at 8.8
        # the rest until the first step, restore excluded: 8.8 -> 9.0 (process start) -> 10.5, less 0.5
        "costs.startup_warm_s": 1.2,
    }
    for key, value in want.items():
        assert m.values[key] == pytest.approx(value), key
    assert m.samples["costs.detect_hang_s"] == 0  # no hang: from the config, and said so
    demo = load_config("demo").resilience  # the run's longest step is 1 s
    assert m.values["costs.detect_hang_s"] == max(demo.hang_timeout_s, demo.hang_step_multiple * 1.0)


@pytest.mark.parametrize(("multiple", "detect"), [("0", 5.0), ("8", 8.0)])
def test_without_a_hang_detection_is_the_runs_hang_rule(tmp_path: Path, multiple: str, detect: float) -> None:
    """max(hang_timeout_s = 5, hang_step_multiple x the longest step, 1 s): the rule the supervisor
    applies (supervisor/watch.py)."""
    hand_made_run(tmp_path / "run")
    config = load_config("demo", [f"--resilience.hang_step_multiple={multiple}"])
    (tmp_path / "run" / "config.toml").write_text(to_toml(config))
    m = measure(tmp_path / "run")
    assert (m.values["costs.detect_hang_s"], m.samples["costs.detect_hang_s"]) == (detect, 0)
    assert any("hang_step_multiple x its longest step" in note for note in m.notes), m.notes


def test_assembled_inputs_say_what_was_measured_and_what_extrapolated(tmp_path: Path) -> None:
    hand_made_run(tmp_path / "run")
    same = assemble(tmp_path / "run", None, ["--job.gpus=2"])
    assert same.inputs.costs.restore_s == pytest.approx(0.5)
    assert same.provenance.kind("costs.restore_s") == "measured"
    big = assemble(tmp_path / "run", None, ["--job.gpus=1024", "--scaling.model=70b"])
    assert big.provenance.kind("costs.restore_s") == "extrapolated"
    assert big.inputs.costs.restore_s > 0.5
    assert big.provenance.kind("costs.detect_crash_s") == "measured"
    assert big.inputs.job.step_time_s == 0  # per-step costs are not carried to another size
    with pytest.raises(ConfigError, match="checkpoint_interval_steps needs"):
        assemble(tmp_path / "run", None, ["--job.gpus=1024", "--job.checkpoint_interval_steps=5"])


def test_plan_command_writes_markdown_html_json_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hand_made_run(tmp_path / "run")
    out = tmp_path / "plan"
    args = ["plan", "--from", str(tmp_path / "run"), "--out", str(out), "--sweep-replicas=20"]
    args += ["--job.gpus=256", "--job.job_days=2", "--job.replicas=40"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "correct goodput" in printed and "Young" in printed and "Daly" in printed
    md = (out / "plan.md").read_text()
    for heading in (
        "## Goodput",
        "## Badput",
        "## Checkpoint interval",
        "## What each mechanism buys",
        "## Sensitivity",
    ):
        assert heading in md
    assert "measured (median of" in md
    html = (out / "plan.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    record = json.loads((out / "plan.json").read_text())
    assert set(record) == {"inputs", "provenance", "notes", "result"}
    assert record["inputs"]["job"]["gpus"] == 256
    assert sorted(p.name for p in (out / "plots").iterdir()) == [
        "plan_breakdown.png",
        "plan_gpus.png",
        "plan_interval.png",
    ]


def test_plan_command_refuses_bad_input_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["plan", "--job.gpuss=8", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown key job.gpuss" in err[0]
    assert main(["plan", "--from", str(tmp_path / "absent"), "--out", str(tmp_path)]) == 3


def test_costs_measured_at_another_scale_say_so_in_the_headline_with_their_range(tmp_path: Path) -> None:
    """A 2-rank CPU cold start (1 s here) is not a 16,384-GPU job's: the headline says which inputs were
    measured at another size and not extrapolated, and what correct goodput is with them at truestep's
    at-scale assumptions instead (the ±50 % sensitivity table hid a likely 10-50x)."""
    from truestep.plan.report import summary_text
    from truestep.plan.study import make_plan

    hand_made_run(tmp_path / "run")
    args = ["--job.gpus=16384", "--job.job_days=2", "--job.replicas=40", "--costs.teardown_s=3"]
    a = assemble(tmp_path / "run", None, args)
    assert a.unscaled["costs.startup_cold_s"] == (1.0, 300.0)  # measured, the default assumption
    assert "costs.teardown_s" not in a.unscaled  # set by the user: not a measurement
    assert "costs.restore_s" not in a.unscaled  # extrapolated by the scaling model
    label = a.provenance.label("costs.startup_cold_s")
    assert (
        label.startswith("measured (median of 1,") and "at 2 ranks: not extrapolated to 16,384 GPUs" in label
    )
    result = make_plan(a, sweep_replicas=20)
    low, high = result.unscaled_correct
    assert high < low  # slower start-ups cost goodput
    text = summary_text(a, result)
    assert "**Not extrapolated:** `startup_cold_s` 1.00 s (assumed at scale: 300.0 s)" in text, text
    assert f"correct goodput is {fmt_pct(high)} instead of {fmt_pct(low)}" in text
    same = assemble(tmp_path / "run", None, ["--job.gpus=2"])
    assert same.unscaled == {}
