"""`truestep audit` against a plain-Python trainer (tests/audit_trainers/toy_trainer.py: real processes,
real signals to their process group, milliseconds to start): what the audit must say about resumes that
are correct, broken, or never happened."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from audit_cases import EXTRA_FLAGS, audit_faulted, command, failure_free, gap_texts, make_plan
from truestep.analysis.verdict import Status
from truestep.audit.plan import AuditError, run_one, write_plan

pytestmark = pytest.mark.multiprocess

TOY = command("toy_trainer.py")


@pytest.fixture(scope="module")
def exact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    plan = make_plan(TOY, "jsonl:log.jsonl", weights="final.safetensors")
    return failure_free(tmp_path_factory.mktemp("toy") / "base", plan), plan


@pytest.fixture(scope="module")
def noisy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """A trainer that is not bitwise deterministic and logs its loss at 4 decimals."""
    plan = make_plan(command("toy_trainer.py", "--noise", "--round", "4"), "jsonl:log.jsonl")
    return failure_free(tmp_path_factory.mktemp("toy-noisy") / "base", plan), plan


def test_cli_judges_a_correct_resume_preserving_after_a_kill_and_a_term(tmp_path: Path) -> None:
    """The whole command: exit 0, the report, summary.json and experiment.json that `truestep report`
    reads, the inferred resumes and the faults in the run's events."""
    out = tmp_path / "audit"
    proc = subprocess.run(
        [sys.executable, "-m", "truestep", "audit", "--out", str(out), "--logs", "jsonl:log.jsonl",
         "--weights", "final.safetensors", "--fault", "kill@step=4", "--fault", "term@step=9", "--grace", "5",
         "--", *TOY],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS: `faulted` bitwise: 12/12 steps" in proc.stdout and "final parameters" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    run = summary["groups"][0]["runs"]["faulted"]
    assert run["resumes"] == 2 and run["faults"] == ["kill@step=4", "term@step=9"]
    assert [i["kind"] for i in run["incidents"]] == ["kill", "term"]
    assert all(i["mttr_s"] is not None and i["mttr_s"] > 0 for i in run["incidents"])
    assert "**PASS**" in (out / "report.md").read_text()
    events = [json.loads(x) for x in (out / "runs/faulted/events.jsonl").read_text().splitlines()]
    (start, *_) = [e for e in events if e["event"] == "run_start"]
    script = TOY[1]
    assert start["command_files"][script] == "sha256:" + hashlib.sha256(Path(script).read_bytes()).hexdigest()
    restores = [e for e in events if e["event"] == "checkpoint_restore"]
    assert [(e["step"], e["inferred"]) for e in restores] == [(4, True), (8, True)]


def test_a_kill_at_a_time_and_a_term_that_is_ignored_then_forced(exact, tmp_path: Path) -> None:
    """kill@time fires on the run's clock; a job that ignores SIGTERM is killed after the grace period
    (make_plan: 5 s, here 0.3 s), and both restarts resume (the faulted run saves every step and takes
    0.2 s a step, so wherever the faults land there is a checkpoint, and time left to force the term)."""
    base, plan = exact
    plan = replace(plan, grace_s=0.3)
    flags = "--ignore-term --save-every 1 --sleep 0.2"
    summary, run = audit_faulted(base, tmp_path / "a", plan, ["kill@time=1.5", "term@step=8"], flags)
    assert run.verdict.status is Status.BITWISE and summary.verdict.exit_code == 0, run.verdict.label
    events = [json.loads(x) for x in (tmp_path / "a/runs/faulted/events.jsonl").read_text().splitlines()]
    faults = [e for e in events if e["event"] == "fault_injected"]
    forced = [(e["spec"], e["forced_at"] is not None) for e in faults]
    assert forced == [("kill@time=1.5", False), ("term@step=8", True)]
    assert faults[1]["forced_at"] - faults[1]["time"] >= 0.3
    assert run.resumes == 2


def test_a_restart_that_starts_over_is_never_preserving(exact, tmp_path: Path) -> None:
    base, plan = exact
    summary, run = audit_faulted(base, tmp_path / "a", plan, ["kill@step=6"], "--no-resume")
    assert run.verdict.status is Status.INCOMPLETE and summary.verdict.exit_code == 8
    said = gap_texts(run)
    assert "the run never resumed from a checkpoint" in said and "attempt 1 started at step 0" in said, said
    assert said.count("resume") == 1, said  # one cause, one gap (the scenario rule's)


def test_a_fault_that_never_fires_is_incomplete(exact, tmp_path: Path) -> None:
    base, plan = exact
    summary, run = audit_faulted(base, tmp_path / "a", plan, ["kill@step=99"])
    assert run.verdict.status is Status.INCOMPLETE and summary.verdict.exit_code == 8
    assert "the fault never fired (kill@step=99" in gap_texts(run)


def test_missing_steps_are_never_preserving(exact, tmp_path: Path) -> None:
    base, plan = exact
    summary, run = audit_faulted(base, tmp_path / "a", plan, ["kill@step=6"], "--skip-steps 9,10")
    assert summary.verdict.exit_code == 8 and "the run never logged steps 9-10" in gap_texts(run)


def test_a_restart_that_never_resumes_gives_up_incomplete(exact, tmp_path: Path) -> None:
    base, plan = exact
    summary, run = audit_faulted(base, tmp_path / "a", plan, ["kill@step=6"], "--fail-on-resume")
    assert summary.verdict.exit_code == 8
    assert "the command did not finish (still not finished after 4 restarts" in gap_texts(run)


def test_momentum_not_restored_is_violated(exact, tmp_path: Path) -> None:
    base, plan = exact
    summary, run = audit_faulted(base, tmp_path / "a", plan, ["kill@step=6"], "--lose-momentum")
    assert summary.verdict.exit_code == 1 and run.verdict.status is Status.VIOLATED
    # Resumed at step 4: step 5's loss is of the restored weights, step 6's of an update without momentum.
    assert run.verdict.violation is not None and run.verdict.violation.step == 6


def test_a_nondeterministic_trainer_gets_a_floor_not_a_false_alarm(noisy, tmp_path: Path) -> None:
    """Noise of 1e-9 between same-seed runs: a correct resume stays within the floor (incomplete only for
    the final parameters, which a digest cannot judge at a nonzero floor and no --weights gave)."""
    base, plan = noisy
    summary, run = audit_faulted(base, tmp_path / "a", plan, ["kill@step=6"])
    floor = summary.groups[0].floor
    assert not floor.bitwise and floor.k == 2 and not floor.insufficient
    assert run.verdict.status is Status.INCOMPLETE and run.verdict.violation is None
    assert [g.what for g in run.verdict.gaps] == ["final parameters not compared at step"]


def test_a_rounded_loss_is_compared_at_its_precision_and_a_broken_resume_still_shows(
    noisy, tmp_path: Path
) -> None:
    base, plan = noisy
    summary, run = audit_faulted(base, tmp_path / "a", plan, ["kill@step=6"], "--lose-momentum")
    floor = summary.groups[0].floor
    assert floor.precision == [
        "loss was logged rounded to 0.0001 (declared by the run): compared at that precision, "
        "a smaller change cannot be seen"
    ]
    assert min(floor.families["loss"].envelope.values) >= 1e-4
    assert run.verdict.status is Status.VIOLATED and summary.verdict.exit_code == 1


def test_a_reference_that_crashed_and_restarted_cannot_serve(tmp_path: Path) -> None:
    """A failure-free run is one attempt: a reference that crashed on its own and was restarted (here it
    even resumed correctly, so no gap names it) is refused when it ends, in one line (exit 3)."""
    plan = make_plan(TOY, "jsonl:log.jsonl", weights="final.safetensors")
    write_plan(tmp_path, plan)
    spec = next(s for s in plan.jobs() if s.role == "reference")
    spec.env = {EXTRA_FLAGS: "--crash-once-at 6"}
    with pytest.raises(
        AuditError, match=r"the failure-free reference run cannot serve: it restarted \(2 attempts\)"
    ):
        run_one(tmp_path, spec)
