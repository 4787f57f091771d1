"""Issue 29: missing, mismatched or duplicated evidence is never agreement. Each case the audit found,
on hand-made run directories (the real-run cases are in test_evidence_runs.py): the verdict names what
it could not compare (INCOMPLETE, exit 8), judges every observable a metrics line logs, judges the
recomputed line of a step logged twice and flags a pre-fault line that disagrees with it, refuses a
reference or floor that is not one, counts repeats that are one run once, refuses to judge at a nonzero
floor of one repeat, and keeps its threshold when one repeat is odd."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from analysis_cases import clean, killed_and_resumed, line, loss_of, start, write_run
from harness import truestep_env
from truestep.analysis.fidelity import compare
from truestep.analysis.floor import measure_floor
from truestep.analysis.runlog import RunLog, RunLogError
from truestep.analysis.summary import analyze_run
from truestep.analysis.verdict import Status, judge
from truestep.telemetry.lines import line_differences


def cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "truestep", *args]
    return subprocess.run(cmd, env=truestep_env(), capture_output=True, text=True, timeout=120)


def edit(run: RunLog, metrics=None, events=None) -> RunLog:
    """Rewrite a hand-made run's logs through functions of the parsed records."""
    if metrics is not None:
        lines = metrics([json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()])
        (run.path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    if events is not None:
        lines = events([json.loads(x) for x in (run.path / "events.jsonl").read_text().splitlines()])
        (run.path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    return RunLog.load(run.path)


def exact(run: RunLog, ref: RunLog):
    return judge(compare(run, ref), measure_floor(ref, []))


def drift(seed: int, scale: float = 1e-4):
    """A same-seed repeat's loss: a deviation that changes sign and grows with the step."""
    return lambda s: loss_of(s) + scale * math.sin(seed * 1.7 + s) * (1 + s / 5)


# --- observables it has but did not judge -----------------------------------------------------------------


@pytest.mark.parametrize(("field", "change"), [("lr", lambda v: v * 1.5), ("tokens_seen", lambda v: v + 256)])
def test_every_logged_observable_is_judged(tmp_path: Path, field: str, change) -> None:
    """lr x1.5 and tokens_seen +256 after step 6, every loss and grad norm bitwise: a violation (the
    old verdict judged loss and grad norm only and called this bitwise)."""
    ref = clean(tmp_path / "ref")
    run = edit(
        killed_and_resumed(tmp_path / "run"),
        metrics=lambda ms: [{**m, field: change(m[field])} if m["attempt"] == 1 else m for m in ms],
    )
    v = exact(run, ref)
    assert v.status is Status.VIOLATED and v.violation.observable == field and v.first_violation_step == 6
    assert v.exit_code == 1


def test_a_new_metrics_field_is_judged_by_default_and_bookkeeping_is_not() -> None:
    a = {"step": 3, "time": 1.0, "mono": 5.0, "attempt": 0, "step_time": 0.1, "loss": 2.0, "mem_gb": 1.0}
    b = {**a, "time": 9.0, "mono": 1.0, "attempt": 1, "step_time": 0.3}
    assert line_differences(a, b) == []
    assert line_differences(a, {**b, "mem_gb": 1.5}) == ["mem_gb"]  # fails closed: declare it bookkeeping
    assert line_differences(a, {**b, "loss": -0.0 + 2.0000000000000004}) == ["loss"]
    assert line_differences({**a, "loss": math.nan}, {**b, "loss": math.nan}) == []
    del b["mem_gb"]
    assert line_differences(a, b) == ["mem_gb"]


# --- a step without a reference line, an attempt with another config --------------------------------------


def test_a_resumed_attempt_with_another_config_is_incomplete_and_names_the_keys(tmp_path: Path) -> None:
    keys = {"optim.lr": 0.0003, "train.seed": 0}

    def events(es):
        out = []
        for e in es:
            if e["event"] == "run_start":
                e = {**e, "trajectory_keys": keys}
                if e["attempt"] == 1:
                    e = {
                        **e,
                        "config_fingerprint": "0123456789abcdef",
                        "trajectory_keys": {**keys, "optim.lr": 0.0004},
                    }
            out.append(e)
        return out

    ref = edit(
        clean(tmp_path / "ref"),
        events=lambda es: [{**e, "trajectory_keys": keys} if e["event"] == "run_start" else e for e in es],
    )
    run = edit(killed_and_resumed(tmp_path / "run"), events=events)
    v = analyze_run("run", run, ref, None).verdict
    assert v.status is Status.INCOMPLETE and v.exit_code == 8
    assert v.label.startswith("INCOMPLETE: another config computed steps 6-10 (5 steps)")
    assert "attempt 1: optim.lr: 0.0003 -> 0.0004" in v.label
    proc = cli("fidelity", str(run.path), "--reference", str(ref.path))
    assert proc.returncode == 8 and "optim.lr: 0.0003 -> 0.0004" in proc.stdout
    # The same resume where the changed lr shows in the logged lr (x1.001): a difference from the reference
    # on steps the reference cannot vouch for is still a difference: VIOLATED, the gap appended.
    lr = edit(run, metrics=lambda ms: [{**m, "lr": m["lr"] * 1.001} if m["attempt"] == 1 else m for m in ms])
    v = analyze_run("lr", lr, ref, None).verdict
    assert v.status is Status.VIOLATED and (v.violation.step, v.violation.observable) == (6, "lr")
    assert "also incomplete: another config computed steps 6-10" in v.label


def test_a_run_of_another_experiment_is_refused_unless_asked(tmp_path: Path) -> None:
    """Issue 24, item 3: a different model/seed is a usage error (exit 3, one line naming the keys), not
    a verdict; --compare-anyway compares, and the verdict is then INCOMPLETE, never a pass."""
    ref = edit(
        clean(tmp_path / "ref"),
        events=lambda es: [
            {**e, "trajectory_keys": {"model.dim": 64, "train.seed": 0}} if e["event"] == "run_start" else e
            for e in es
        ],
    )
    other = edit(
        killed_and_resumed(tmp_path / "other"),
        events=lambda es: [
            {
                **e,
                "config_fingerprint": "0123456789abcdef",
                "trajectory_keys": {"model.dim": 128, "train.seed": 1},
            }
            if e["event"] == "run_start"
            else e
            for e in es
        ],
    )
    proc = cli("fidelity", str(other.path), "--reference", str(ref.path))
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 3 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "model.dim: 64 -> 128; train.seed: 0 -> 1" in lines[0] and "--compare-anyway" in lines[0]
    proc = cli("fidelity", str(other.path), "--reference", str(ref.path), "--compare-anyway")
    assert proc.returncode == 8 and "INCOMPLETE: another config computed steps 1-10" in proc.stdout


def test_a_shorter_reference_leaves_the_rest_unverified(tmp_path: Path) -> None:
    """Steps past the reference's end have no reference line: INCOMPLETE (exit 8), never bitwise + 0."""
    ref = clean(tmp_path / "ref", steps=6)
    run = killed_and_resumed(tmp_path / "run")
    v = exact(run, ref)
    assert v.status is Status.INCOMPLETE and v.exit_code == 8
    assert v.gaps[0].text == "no reference line for steps 7-10 (4 steps)"
    assert cli("fidelity", str(run.path), "--reference", str(ref.path)).returncode == 8


# --- the final parameters, checkpoints --------------------------------------------------------------------


def test_a_run_without_a_final_digest_is_incomplete(tmp_path: Path) -> None:
    """Equal losses say nothing about the last update (it changes no logged loss): without a final
    digest or checkpoint the parameters were never compared, and the old verdict said bitwise."""
    ref = clean(tmp_path / "ref")
    run = edit(clean(tmp_path / "run"), events=lambda es: [e for e in es if e["event"] != "run_end"])
    v = exact(run, ref)
    assert v.status is Status.INCOMPLETE and not v.evidence.final_parameters
    assert v.label.startswith("INCOMPLETE: final parameters not compared at step 10")
    assert exact(clean(tmp_path / "ok"), ref).label == (
        "bitwise: 10/10 steps, 0/0 checkpoints, final parameters (logged digests only: no checkpoint re-read)"
    )


def test_skipping_the_state_is_said_not_passed(tmp_path: Path) -> None:
    """--skip-state with checkpoints both runs kept: the checkpoints are named as not compared."""
    ref, run = clean(tmp_path / "ref"), clean(tmp_path / "run")
    for r in (ref, run):
        (r.path / "checkpoints" / "step_00000005").mkdir(parents=True)
        (r.path / "checkpoints" / "step_00000005" / "COMMITTED").write_text("")
    c = compare(run, ref, None)
    assert c.checkpoint_steps == [5] and not c.state_read
    v = judge(c, measure_floor(ref, [], read_state=False))
    assert v.status is Status.INCOMPLETE and "checkpoints not read (--skip-state)" in v.label


# --- duplicated lines ---------------------------------------------------------------------------------------


def test_the_recomputed_line_is_judged_not_the_last_in_the_file(tmp_path: Path) -> None:
    """A stale pre-fault line of step 6 appended after the recomputed ones: the old rule (last line in
    file order wins) judged the stale line; the recomputed line (attempt 1) is judged, and a pre-fault
    line that disagrees with it is itself a finding."""
    ref = clean(tmp_path / "ref")
    run = killed_and_resumed(tmp_path / "run")
    assert exact(run, ref).label.startswith(
        "bitwise: 10/10 steps, 0/0 checkpoints, final parameters (logged digests only: no checkpoint "
        "re-read), 1 pre-fault"
    )
    stale = edit(
        killed_and_resumed(tmp_path / "stale"),
        metrics=lambda ms: ms + [line(6, 0, 7.0, loss=loss_of(6) + 0.25)],
    )
    assert stale.final_steps[6]["attempt"] == 1
    v = exact(stale, ref)
    assert v.status is Status.VIOLATED and v.violation.step == 6
    assert v.violation.observable == "loss (pre-fault line != recomputed)"


def test_a_pre_fault_line_the_resume_did_not_reproduce_is_a_finding(tmp_path: Path) -> None:
    """The recomputed line matches the reference, the line logged before the kill did not: the resume
    recomputed the step differently from the first time (what a resume self-check looks at)."""
    ref = clean(tmp_path / "ref")
    run = edit(
        killed_and_resumed(tmp_path / "run"),
        metrics=lambda ms: [
            {**m, "grad_norm": 9.0} if (m["attempt"], m["step"]) == (0, 6) else m for m in ms
        ],
    )
    v = exact(run, ref)
    assert (
        v.status is Status.VIOLATED and v.violation.observable == "grad_norm (pre-fault line != recomputed)"
    )
    [replay] = compare(run, ref).replays
    assert (replay.step, replay.attempt, replay.judged_attempt, replay.differs) == (6, 0, 1, ("grad_norm",))


def test_lines_after_a_nan_the_guard_skipped_are_not_compared(tmp_path: Path) -> None:
    """A NaN rollback recomputes steps in the same attempt: the NaN step's own line is a failed
    computation, expected to differ; it is counted as not compared, not as a finding."""
    ref = clean(tmp_path / "ref")
    metrics = [line(s, 0, 1.0 + s) for s in range(1, 7)]
    metrics.append(line(7, 0, 8.0, loss=math.nan))
    metrics += [line(s, 0, 9.0 + s) for s in range(6, 11)]
    events = [
        start(0, 0.5, 0.0),
        {"time": 8.1, "event": "nonfinite_step_skipped", "attempt": 0, "step": 7},
        {"time": 8.2, "event": "checkpoint_restore", "attempt": 0, "step": 5, "restore_s": 0.1},
        {"time": 20.0, "event": "run_end", "attempt": 0, "step": 10, "param_digest": "final"},
    ]
    run = write_run(tmp_path / "run", metrics, events)
    c = compare(run, ref)
    assert [r.step for r in c.replays] == [6] and c.replays_not_compared == [7]
    v = judge(c, measure_floor(ref, []))
    assert v.status is Status.BITWISE and "1 line after a non-finite step not compared" in v.label


def test_a_step_saved_twice_with_different_digests_is_a_finding(tmp_path: Path) -> None:
    ref = clean(tmp_path / "ref")
    run = edit(
        killed_and_resumed(tmp_path / "run"),
        events=lambda es: (
            es
            + [{"time": 12.0, "event": "checkpoint_save", "attempt": 1, "step": 5, "param_digest": "other"}]
        ),
    )
    assert run.digests()[5] == "other"  # the latest attempt's digest is judged
    v = exact(run, ref)
    assert v.status is Status.VIOLATED and v.violation.observable == "digest (pre-fault line != recomputed)"


# --- the reference and the floor ------------------------------------------------------------------------


def test_a_faulted_reference_without_events_is_refused(tmp_path: Path) -> None:
    """Without events.jsonl nothing shows the reference was failure-free: refused, not trusted."""
    ref = killed_and_resumed(tmp_path / "ref")
    (ref.path / "events.jsonl").unlink()
    run = clean(tmp_path / "run")
    proc = cli("fidelity", str(run.path), "--reference", str(ref.path))
    assert proc.returncode == 3 and "no run_start with a config fingerprint" in proc.stderr
    with pytest.raises(RunLogError, match="no run_start"):
        measure_floor(RunLog.load(ref.path), [])


def test_a_reference_that_stopped_early_is_refused(tmp_path: Path) -> None:
    ref = edit(
        clean(tmp_path / "ref", steps=6),
        events=lambda es: [
            {**e, "max_steps": 10}
            if e["event"] == "run_start"
            else {**e, "reason": "stop_at_step"}
            if e["event"] == "run_end"
            else e
            for e in es
        ],
    )
    with pytest.raises(RunLogError, match="stopped at step 6 of 10 \\(stop_at_step\\)"):
        measure_floor(ref, [])


def test_the_reference_or_a_copy_of_it_is_no_floor(tmp_path: Path) -> None:
    """The reference given as its own floor is refused; a copy of it counts as no draw, a copy of a
    repeat counts once (the old floor took both, and its thresholds became infinite)."""
    import shutil

    ref = clean(tmp_path / "ref")
    with pytest.raises(RunLogError, match="is the reference itself"):
        measure_floor(ref, [ref])
    shutil.copytree(ref.path, tmp_path / "ref-copy")
    rep = clean(tmp_path / "rep", loss=drift(1), digest="r1")
    shutil.copytree(rep.path, tmp_path / "rep-copy")
    floor = measure_floor(ref, [RunLog.load(tmp_path / "ref-copy"), rep, RunLog.load(tmp_path / "rep-copy")])
    assert floor.k == 1 and floor.insufficient
    assert len(floor.notes) == 2 and all("copy of" in n for n in floor.notes)


def test_bit_identical_repeats_at_a_nonzero_floor_count_once(tmp_path: Path) -> None:
    """Two repeats with the same observables are one draw of the noise; a repeat identical to the
    reference while the others are not is none."""
    ref = clean(tmp_path / "ref")
    same_a = clean(tmp_path / "a", loss=drift(1), digest="a")
    same_b = clean(tmp_path / "b", loss=drift(1), digest="a")
    as_ref = clean(tmp_path / "c")
    other = clean(tmp_path / "d", loss=drift(2), digest="d")
    floor = measure_floor(ref, [same_a, same_b, as_ref, other])
    assert floor.k == 2 and floor.repeats == [str(same_a.path), str(other.path)]
    assert "calibrated over 2 distinct repeats" in floor.label


def test_one_repeat_at_a_nonzero_floor_judges_nothing(tmp_path: Path) -> None:
    """K = 1: no threshold can be calibrated. The old verdict judged with tau = margin and flagged
    failure-free runs; now it says insufficient floor (exit 8) unless the run is bitwise."""
    ref = clean(tmp_path / "ref")
    floor = measure_floor(ref, [clean(tmp_path / "f", loss=drift(1), digest="f")])
    assert floor.insufficient and floor.guarantee is None
    v = judge(compare(clean(tmp_path / "x", loss=drift(3), digest="x"), ref), floor)
    assert v.status is Status.INSUFFICIENT_FLOOR and v.exit_code == 8 and v.violation is None
    assert v.label.startswith("insufficient floor (INSUFFICIENT: 1 distinct repeat")
    assert judge(compare(clean(tmp_path / "same"), ref), floor).status is Status.BITWISE


def test_a_floor_of_another_layout_needs_a_flag_and_says_so(tmp_path: Path) -> None:
    def in_layout(name: str, layout: str, loss=None, digest="final") -> RunLog:
        run = clean(tmp_path / name, loss=loss, digest=digest)
        return edit(
            run, events=lambda es: [{**e, "layout": layout} if e["event"] == "run_start" else e for e in es]
        )

    ref = in_layout("ref", "dp1 x tp1")
    same = in_layout("same", "dp1 x tp1", drift(1), "s")
    wide = in_layout("wide", "dp2 x tp1", drift(2), "w")
    with pytest.raises(RunLogError, match="ran in layout dp2 x tp1, the reference in dp1 x tp1"):
        measure_floor(ref, [same, wide])
    floor = measure_floor(ref, [same, wide], cross_layout=True)
    assert floor.cross_layout and "CROSS-LAYOUT: dp1 x tp1 / dp2 x tp1" in floor.label
    proc = cli(
        "fidelity",
        str(ref.path),
        "--reference",
        str(ref.path),
        "--floor",
        str(same.path),
        "--floor",
        str(wide.path),
    )
    assert proc.returncode == 3 and "--cross-layout-floor" in proc.stderr


# --- a threshold robust to one odd repeat ----------------------------------------------------------------


def test_one_odd_repeat_neither_widens_the_envelope_nor_inflates_tau(tmp_path: Path) -> None:
    """Four repeats, one with a transient spike 100x its usual deviation at step 4. A run off by 10x the
    floor late in the run: the old rule (the largest leave-one-out draw, the largest repeat) let the spike
    set both the envelope and tau and passed it; the second-largest ignores one odd repeat."""
    steps = 40
    ref = clean(tmp_path / "ref", steps=steps)
    repeats = [clean(tmp_path / f"f{i}", steps=steps, loss=drift(i, 1e-5), digest=f"d{i}") for i in range(3)]
    spike = lambda s: drift(7, 1e-5)(s) + (1e-3 if s == 4 else 0.0)  # noqa: E731
    repeats.append(clean(tmp_path / "odd", steps=steps, loss=spike, digest="odd"))
    floor = measure_floor(ref, repeats)
    loss = floor.families["loss"]
    assert floor.order == 2 and loss.tau < 2 * 10, loss.loo
    assert max(loss.envelope.values) < 1e-4  # the spike (1e-3) is not in it
    late = clean(
        tmp_path / "late", steps=steps, loss=lambda s: loss_of(s) + (1e-3 if s == 35 else 0), digest="x"
    )
    v = judge(compare(late, ref), floor)
    assert v.violation is not None and (v.violation.step, v.violation.observable) == (35, "loss")
    assert floor.guarantee == pytest.approx(2 / 5) and "<= 2/5 = 40 %" in floor.label
