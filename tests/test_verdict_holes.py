"""The holes a review found in the verdict and the accounting (issue 11), each on a hand-made run
directory: the instrument must refuse a floor that is not one, judge parameters and grad norms, never
count what it cannot verify, judge each step against the floor at that step, say one verdict everywhere,
and account for every second without clamping."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis_cases import clean, killed_and_resumed, line, loss_of, noisy, start, write_run
from harness import truestep_env
from truestep.analysis.fidelity import compare
from truestep.analysis.floor import measure_floor
from truestep.analysis.goodput import goodput
from truestep.analysis.mttr import incidents
from truestep.analysis.runlog import RunLog, RunLogError
from truestep.analysis.verdict import Status, judge, scalar_rule


def cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "truestep", *args]
    return subprocess.run(cmd, env=truestep_env(), capture_output=True, text=True, timeout=120)


def one_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


# --- hole 1: the floor run is validated ----------------------------------------------------------------


def test_a_floor_with_a_non_finite_value_is_refused(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    bad = clean(tmp_path / "bad", loss=lambda s: float("nan") if s == 4 else loss_of(s))
    with pytest.raises(RunLogError, match="non-finite loss or grad norm at step 4"):
        measure_floor(ref, [bad])
    run = killed_and_resumed(tmp_path / "run", later_loss=lambda s: loss_of(s) + 0.1)
    proc = cli("fidelity", str(run.path), "--reference", str(ref.path), "--floor", str(bad.path))
    assert proc.returncode == 3 and "non-finite" in one_line(proc.stderr)


def test_a_floor_of_another_config_is_refused(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    other = clean(tmp_path / "other", loss=noisy(1e-2, 1), fingerprint="0123456789abcdef")
    proc = cli("fidelity", str(ref.path), "--reference", str(ref.path), "--floor", str(other.path))
    assert proc.returncode == 3
    assert "config fingerprint 0123456789abcdef" in one_line(proc.stderr)


def test_a_floor_that_was_faulted_or_resumed_is_refused(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    with pytest.raises(RunLogError, match="injected faults"):
        measure_floor(ref, [killed_and_resumed(tmp_path / "faulted")])
    end = {"time": 8.5, "event": "run_end", "attempt": 0, "step": 7, "param_digest": "d"}
    short = write_run(tmp_path / "short", [line(s, 0, 1.0 + s) for s in range(1, 8)], [start(0, 0.6), end])
    with pytest.raises(RunLogError, match="cover exactly the reference's steps"):
        measure_floor(ref, [short])


# --- hole 2: the verdict sees parameters -----------------------------------------------------------------


def test_equal_losses_with_a_different_final_digest_are_a_violation(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    run = killed_and_resumed(tmp_path / "run")
    ends = (
        (run.path / "events.jsonl").read_text().replace('"param_digest": "final"', '"param_digest": "zeroed"')
    )
    (run.path / "events.jsonl").write_text(ends)
    run = RunLog.load(run.path)
    v = judge(compare(run, ref), measure_floor(ref, []))
    assert v.status is Status.VIOLATED and v.violation.observable == "digest" and v.first_violation_step == 10
    proc = cli("fidelity", str(run.path), "--reference", str(ref.path))
    assert proc.returncode == 1 and proc.stdout.startswith(f"{run.path}: VIOLATED at step 10 (digest)")


# --- hole 3: steps the reference does not have are unverifiable ----------------------------------------


def test_steps_past_the_reference_are_unverifiable_and_never_correct(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    longer = clean(tmp_path / "longer", steps=12)
    c = compare(longer, ref)
    assert c.unverifiable_steps == [11, 12]
    v = judge(c, measure_floor(ref, []))
    # Issue 29: a step without a reference line is missing evidence, never agreement (exit 8, not 0).
    assert v.status is Status.INCOMPLETE and v.unverifiable_steps == 2 and v.exit_code == 8
    assert v.label.startswith("INCOMPLETE: no reference line for steps 11-12 (2 steps)")
    g = goodput(longer, v.first_violation_step, set(c.unverifiable_steps))
    assert g.steps == 12 and g.correct_steps == 10 and g.unverifiable_steps == 2
    assert g.badput_s["unverifiable"] == pytest.approx(2.0) and g.useful_s == pytest.approx(10.0)


# --- hole 4: the floor is judged per step ---------------------------------------------------------------


def test_a_perturbation_early_is_caught_where_the_floor_is_still_small(tmp_path: Path) -> None:
    """GPU-like drift: repeats differ by ~2e-5 early and ~6e-3 late. A 1e-2 jump at step 3 is within the
    scalar rule's 2 x max floor (1.2e-2) but 250 x the floor at step 3."""

    def drift(seed: int):
        return lambda s: loss_of(s) + (1 + 0.1 * seed) * 2e-5 * 2 ** (s - 2) * (-1) ** seed

    ref = clean(tmp_path / "ref")
    repeats = [clean(tmp_path / f"rep{k}", loss=drift(k), digest=f"d{k}") for k in range(3)]
    floor = measure_floor(ref, repeats)
    run = clean(tmp_path / "run", loss=lambda s: loss_of(s) + (1e-2 if s == 3 else 0.0), digest="x")
    c = compare(run, ref)
    assert scalar_rule(c, floor) is None  # the old rule calls it within the floor
    v = judge(c, floor)
    assert v.status is Status.VIOLATED and v.first_violation_step == 3 and v.violation.observable == "loss"
    assert v.violation.threshold < 1e-3


# --- hole 5: one verdict, labels and exit codes that agree ----------------------------------------------


def test_equal_loss_bits_with_a_different_grad_norm_is_not_bitwise(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    run = clean(tmp_path / "run", grad=lambda s: 1.0 + s * 0.01 + (1e-7 if s == 6 else 0.0))
    c = compare(run, ref)
    assert not c.bitwise and c.first_divergent_step == 6
    v = judge(c, measure_floor(ref, []))
    assert v.label == "VIOLATED at step 6 (grad_norm)" and v.exit_code == 1


# --- hole 6: accounting ----------------------------------------------------------------------------------


def test_wall_clock_starts_at_the_first_process_start(tmp_path: Path) -> None:
    """A plain `truestep train` stop + resume: no supervisor, so the first record is run_start, written
    2 s after the process started."""
    metrics = [line(s, 0, 3.0 + s) for s in range(1, 6)] + [line(s, 1, 8.0 + s) for s in range(6, 11)]
    events = [
        start(0, 2.5, 0.0),
        {"time": 8.2, "event": "run_end", "attempt": 0, "step": 5, "param_digest": "d5"},
        start(1, 10.5, 10.0),
        {"time": 11.0, "event": "checkpoint_restore", "attempt": 1, "step": 5, "restore_s": 0.3},
        {"time": 18.2, "event": "run_end", "attempt": 1, "step": 10, "param_digest": "final"},
    ]
    g = goodput(write_run(tmp_path / "run", metrics, events), None)
    assert g.start_time == 0.0 and g.wall_s == pytest.approx(18.2)
    assert g.badput_s["startup"] == pytest.approx(3.0 + (3.0 - 0.3))
    assert g.badput_s["requeue_wait"] == pytest.approx(10.0 - 8.2)
    assert g.badput_s["other"] >= 0 and g.inconsistencies == []
    assert g.useful_s + sum(g.badput_s.values()) == pytest.approx(g.wall_s)


def test_overlapping_attempts_are_reported_not_a_crash(tmp_path: Path) -> None:
    """Attempt 1 (a slow node: process up at 7.0, first record at 9.5) is still writing after the requeued
    attempt 2 started at 8.0: none of its records precedes attempt 2."""
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 6)] + [line(s, 1, 4.0 + s) for s in (6, 7)]
    metrics += [line(s, 2, 5.0 + s) for s in range(6, 11)]
    events = [
        start(0, 0.5, 0.0),
        {"time": 6.1, "event": "checkpoint_save", "attempt": 0, "step": 5, "blocking_s": 0.0},
        start(1, 9.5, 7.0),
        start(2, 8.5, 8.0),
        {"time": 9.0, "event": "checkpoint_restore", "attempt": 2, "step": 5, "restore_s": 0.3},
    ]
    g = goodput(write_run(tmp_path / "run", metrics, events), None)
    assert g.wall_s == pytest.approx(15.0) and g.badput_s["lost_work"] == pytest.approx(2.0)
    assert any("attempt 1 was still writing 3 s after attempt 2 started" in p for p in g.inconsistencies)
    assert g.badput_s["other"] < 0  # never clamped: the overlap is counted twice and said so
    assert any("more than the wall clock" in p for p in g.inconsistencies)


def test_a_step_zero_line_does_not_divide_by_zero(tmp_path: Path) -> None:
    zero = dict(line(1, 0, 1.0), step=0, tokens_seen=0)
    run = write_run(
        tmp_path / "run", [zero] + [line(s, 0, 1.0 + s) for s in range(1, 4)], [start(0, 0.5, 0.0)]
    )
    assert run.tokens_per_step == 256 and goodput(run, None).correct_steps == 4


def test_a_directory_without_metrics_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    ref = clean(tmp_path / "ref")
    proc = cli("fidelity", str(tmp_path / "empty"), "--reference", str(ref.path))
    assert proc.returncode == 3 and "not a truestep run directory" in one_line(proc.stderr)
    (ref.path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    proc = cli("goodput", str(ref.path))
    assert proc.returncode == 3 and "lacks" in one_line(proc.stderr)


def test_mttr_of_a_term_whose_attempt_then_crashed(tmp_path: Path) -> None:
    """term at 6.2, the ranks agree at 6.3, the emergency save crashes; the supervisor detects at 7.0 and
    is down at 7.2; attempt 1 runs to the end and logs the only run_end (at 20)."""
    sup = {"source": "supervisor"}
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 6)] + [line(s, 1, 4.0 + s) for s in range(6, 11)]
    events = [
        {"time": 0.0, "event": "attempt_start", "attempt": 0, **sup},
        start(0, 0.5, 0.0),
        {"time": 6.2, "event": "fault_injected", "kind": "term", "attempt": 0, "spec": "term:step=5"},
        {"time": 6.3, "event": "signal_received", "attempt": 0, "stop_step": 5},
        {"time": 6.5, "event": "fault_injected", "kind": "crash", "attempt": 0, "spec": "crash-in-save"},
        {"time": 7.0, "event": "failure_detected", "attempt": 0, "detected_at": 7.0, **sup},
        {"time": 7.2, "event": "teardown_complete", "teardown_s": 0.2, **sup},
        {"time": 7.5, "event": "attempt_start", "attempt": 1, **sup},
        start(1, 8.0, 7.6),
        {"time": 9.0, "event": "checkpoint_restore", "attempt": 1, "step": 5, "restore_s": 0.4},
        {"time": 20.0, "event": "run_end", "attempt": 1, "step": 10, "param_digest": "x"},
    ]
    term = incidents(write_run(tmp_path / "run", metrics, events))[0]
    assert term.kind == "term"
    assert term.phases_s == pytest.approx(
        {"detect": 0.1, "teardown": 0.9, "relaunch": 0.3, "restore": 1.5, "first_step": 1.0}
    )
    assert term.mttr_s == pytest.approx(10.0 - 6.2)


def test_a_nan_rollback_after_the_relaunch_is_not_its_restore(tmp_path: Path) -> None:
    run = killed_and_resumed(tmp_path / "run")
    events = [json.loads(x) for x in (run.path / "events.jsonl").read_text().splitlines()]
    events.append({"time": 13.9, "event": "checkpoint_restore", "attempt": 1, "step": 5, "restore_s": 0.1})
    (run.path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    [inc] = incidents(RunLog.load(run.path))
    assert inc.phases_s["restore"] == pytest.approx(1.4) and inc.mttr_s == pytest.approx(4.0)


@pytest.mark.parametrize(
    "spec",
    ["crash-in-save:phase=mid-shards:from=13:rank=0", "term:time=2.5:restart=1", "kill:rank=1:step=12"],
)
def test_the_logged_fault_spec_is_re_runnable(spec: str) -> None:
    """The spec logged with fault_injected (FaultSpec.describe) parses back to the same fault."""
    from truestep.faults.spec import parse_fault

    logged = parse_fault(spec).describe()
    assert logged == spec and parse_fault(logged) == parse_fault(spec)
