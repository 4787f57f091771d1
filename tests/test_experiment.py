"""The instrument end to end: a real experiment with two faults, and the reduced ablation matrix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import truestep_env
from supervised import standby_overrides
from truestep.analysis.runlog import RunLog
from truestep.analysis.verdict import CellVerdict
from truestep.experiment.plan import plan_jobs
from truestep.experiment.runner import run_plan
from truestep.experiment.summary import ExperimentSummary, summarize

pytestmark = pytest.mark.multiprocess


def test_experiment_with_two_faults_is_bitwise_and_reported(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    cmd = [sys.executable, "-m", "truestep", "experiment", "demo", f"--out={out}", "--nproc=2"]
    cmd += ["--fault=kill:rank=1:step=12", "--fault=term:step=22:restart=1", "--train.max_steps=26"]
    cmd += standby_overrides()
    proc = subprocess.run(
        cmd + ["--repeats=1"], env=truestep_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [group] = json.loads((out / "summary.json").read_text())["groups"]
    assert group["floor"]["bitwise"] and group["floor"]["repeats"] == [str(out / "runs" / "floor-1")]
    faulted = group["runs"]["faulted"]
    assert (
        faulted["verdict"]["status"] == "bitwise" and faulted["comparison"]["fraction_bitwise_equal"] == 1.0
    )
    # "bitwise" only for what was compared, with the counts (issue 29).
    assert faulted["verdict"]["label"].startswith("bitwise: 26/26 steps, ")
    assert "final parameters" in faulted["verdict"]["label"] and not faulted["verdict"]["gaps"]
    # Parameters and optimizer moments were compared at every checkpoint both runs kept: all exactly 0.
    state = faulted["comparison"]["state"]
    assert state and all(v == 0.0 for d in state for v in d["totals"].values())
    assert [i["kind"] for i in faulted["incidents"]] == ["kill", "term"]
    assert all(i["mttr_s"] is not None and i["mttr_s"] > 0 for i in faulted["incidents"])
    assert faulted["goodput"]["badput_s"]["lost_work"] > 0  # the kill cost recomputed steps
    assert faulted["goodput"]["correct_tokens_per_s"] == faulted["goodput"]["plain_tokens_per_s"]
    assert "PASS" in proc.stdout
    for name in ("report.md", "report.html"):
        assert (out / name).stat().st_size > 0


@pytest.fixture(scope="module")
def ablation(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ExperimentSummary]:
    """The reduced ablation matrix in both modes (hard kills, graceful preemptions) on a single process,
    judged against one reference and one floor made once for both modes."""
    out = tmp_path_factory.mktemp("ablation")
    overrides = ["--train.max_steps=20", *standby_overrides()]
    jobs = plan_jobs(
        "demo",
        overrides,
        1,
        [],
        ablation=True,
        ablation_modes=["hard", "graceful"],
        fault_step=13,
        interval=5,
        repeats=1,
    )
    run_plan(out, jobs, progress=False)
    return out, summarize(out)


def cells_of(summary: ExperimentSummary, mode: str) -> dict[str, CellVerdict]:
    return {c.row: c for c in summary.groups[0].cells if c.mode == mode}


def test_reduced_ablation_flags_every_disabled_mechanism(ablation: tuple[Path, ExperimentSummary]) -> None:
    """Hard kills on a single process: every disabled mechanism is flagged, all-on is not."""
    out, summary = ablation
    cells = cells_of(summary, "hard")
    assert not cells["all-on"].flagged and cells["all-on"].verdict.first_divergent_step is None
    # Relative to the step the cell resumed from (an async save may still be in flight at the kill):
    # fresh AdamW moments first change the weights in the first resumed update, so the loss after it
    # differs; dropout masks, batches and (atomic-commit-off: torn save, counters restored, weights
    # not) change the very first resumed forward pass.
    expected_after_resume = {
        "optimizer-restore-off": 2,
        "rng-restore-off": 1,
        "data-position-off": 1,
        "atomic-commit-off": 1,
    }
    for row, offset in expected_after_resume.items():
        run = RunLog.load(out / "runs" / f"ablation-{row}-hard")
        resumed_at = run.named("checkpoint_restore")[0]["step"]
        gp = summary.groups[0].runs[cells[row].run].goodput
        assert cells[row].flagged, row
        assert cells[row].verdict.first_divergent_step == resumed_at + offset, (row, resumed_at, cells[row])
        assert gp.correct_tokens_per_s < gp.plain_tokens_per_s, row
    # The run's own self-check, with no reference, agrees with the reference-based verdict: all-on
    # verified, each mechanism off flagged at the same first divergent step.
    by_name = summary.groups[0].runs
    assert by_name[cells["all-on"].run].self_check == "verified 1"
    for row in expected_after_resume:
        analysis = by_name[cells[row].run]
        assert analysis.self_check == f"DIVERGED at {cells[row].verdict.first_divergent_step}", (
            row,
            analysis,
        )


@pytest.mark.slow
def test_graceful_ablation_each_disabled_mechanism_flags_itself(
    ablation: tuple[Path, ExperimentSummary],
) -> None:
    """Preemptions (SIGTERM, emergency save, requeue) on a single process: the stop witness (or, for the
    torn emergency save of atomic-commit-off, the restored-digest check) flags every disabled
    mechanism's resume with no reference, where the reference-based verdict flags it too; all-on
    verifies itself. The witness sees fresh optimizer moments at the first step (its fingerprint),
    before the trajectory shows them one step later."""
    summary = ablation[1]
    cells = cells_of(summary, "graceful")
    runs = summary.groups[0].runs
    assert not cells["all-on"].flagged and runs[cells["all-on"].run].self_check == "verified 1"
    for row in ("optimizer-restore-off", "rng-restore-off", "data-position-off", "atomic-commit-off"):
        cell, analysis = cells[row], runs[cells[row].run]
        first = cell.verdict.first_divergent_step
        assert cell.flagged and first is not None, row
        assert analysis.self_check.startswith("DIVERGED at "), (row, analysis.self_check)
        assert int(analysis.self_check.removeprefix("DIVERGED at ")) <= first, (
            row,
            analysis.self_check,
            first,
        )
