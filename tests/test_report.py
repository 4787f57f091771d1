"""The report (analysis/report/, its figures in analysis/report/plots/) on small hand-made experiment directories.

No training happens here: the run directories are written line by line, shaped like what the trainer,
the supervisor and the fault hooks write, so the numbers the report must show are known exactly.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from analysis_cases import PROVENANCE  # noqa: E402
from harness import truestep_env  # noqa: E402
from truestep.analysis.fidelity import compare  # noqa: E402
from truestep.analysis.floor import measure_floor  # noqa: E402
from truestep.analysis.goodput import goodput  # noqa: E402
from truestep.analysis.report import fmt_rate, fmt_seconds, render_run_text, write_report  # noqa: E402
from truestep.analysis.runlog import RunLog, RunLogError  # noqa: E402
from truestep.analysis.verdict import judge  # noqa: E402
from truestep.experiment.summary import summarize  # noqa: E402

T0 = 1000.0
STEP_S = 0.1
BLOCKING_S = 0.02
TOKENS = 64
STEPS = 10
SAVE_AT = 5
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_RUNS = itertools.count()


def loss_at(step: int) -> float:
    return 4.0 - 0.25 * step + 0.01 * (step % 3)


def grad_at(step: int) -> float:
    return 1.0 + 0.05 * step


class RunWriter:
    """Builds one run directory on a simulated wall clock."""

    def __init__(self) -> None:
        self.metrics: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.now = T0 + 1e-3 * next(_RUNS)  # each run starts at its own instant (a copy would not)

    def sup(self, event: str, **fields: Any) -> None:
        self.events.append({"time": self.now, "source": "supervisor", "node": 0, "event": event, **fields})

    def ev(self, attempt: int, event: str, **fields: Any) -> None:
        self.events.append({"time": self.now, "attempt": attempt, "event": event, **fields})

    def launch(self, attempt: int, startup: float = 1.0) -> None:
        self.sup("attempt_start", attempt=attempt, pids=[1234 + attempt], master_port=29500)
        began = self.now
        self.now += startup / 2
        self.ev(
            attempt,
            "run_start",
            process_start=began,
            start_step=0,
            config_fingerprint="f00d",
            provenance=PROVENANCE,
        )
        self.now = began + startup

    def steps(self, attempt: int, first: int, last: int, perturb: dict[int, float] | None = None) -> None:
        perturb = perturb or {}
        for step in range(first, last + 1):
            self.now += STEP_S
            self.metrics.append(
                {
                    "time": self.now,
                    "attempt": attempt,
                    "step": step,
                    "loss": loss_at(step) + perturb.get(step, 0.0),
                    "grad_norm": grad_at(step),
                    "lr": 1e-3,
                    "tokens_seen": TOKENS * step,
                    "step_time": STEP_S,
                }
            )
            if step == SAVE_AT:
                self.now += BLOCKING_S
                self.ev(
                    attempt,
                    "checkpoint_save",
                    step=step,
                    reason="interval",
                    blocking_s=BLOCKING_S,
                    param_digest=f"digest-{step}",
                )

    def end(self, attempt: int, digest: str = "digest-final") -> None:
        self.now += 0.01
        self.ev(attempt, "run_end", step=STEPS, reason="completed", param_digest=digest)
        self.now += 0.01
        self.sup("supervisor_end", outcome="completed", restarts=attempt)

    def write(self, run_dir: Path) -> Path:
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in self.metrics))
        (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in self.events))
        return run_dir


def clean_run(perturb: dict[int, float] | None = None, digest: str = "digest-final") -> RunWriter:
    w = RunWriter()
    w.sup("supervisor_start", nproc=1, nnodes=1, max_restarts=3)
    w.launch(0)
    w.steps(0, 1, STEPS, perturb)
    w.end(0, digest)
    return w


# The faulted shape: attempt 0 runs steps 1..6 (saves at 5), a kill lands after step 6, the supervisor
# detects it DETECT_S later, tears down in TEARDOWN_S, relaunches after RELAUNCH_S; attempt 1 restores
# step 5 (RESTORE_S) and recomputes 6..10.
DETECT_S, TEARDOWN_S, RELAUNCH_S, STARTUP_S, RESTORE_S = 0.3, 0.1, 0.05, 1.0, 0.2


def faulted_run(
    after_resume: dict[int, float] | None = None, digest: str = "digest-final"
) -> tuple[RunWriter, dict]:
    w = RunWriter()
    w.sup("supervisor_start", nproc=1, nnodes=1, max_restarts=3)
    w.launch(0)
    w.steps(0, 1, 6)
    w.now += 0.01
    fault_time = w.now
    w.events.append(
        {
            "time": w.now,
            "source": "fault",
            "event": "fault_injected",
            "kind": "kill",
            "point": "after_step",
            "step": 6,
            "rank": 0,
            "attempt": 0,
            "spec": "kill:rank=0:step=6",
        }
    )
    w.now += DETECT_S
    w.sup(
        "failure_detected",
        kind="process_exit",
        rank=0,
        detail="exit codes {0: -9}",
        exit_codes={"0": -9},
        detected_at=w.now,
    )
    w.now += TEARDOWN_S
    w.sup("teardown_complete", teardown_s=TEARDOWN_S)
    w.sup("restart", restart=1, after="failed")
    w.now += RELAUNCH_S
    relaunch = w.now
    w.sup("attempt_start", attempt=1, pids=[2000], master_port=29501)
    w.now += STARTUP_S / 2
    w.ev(
        1, "run_start", process_start=relaunch, start_step=0, config_fingerprint="f00d", provenance=PROVENANCE
    )
    w.now = relaunch + STARTUP_S - RESTORE_S
    w.now += RESTORE_S
    w.ev(1, "checkpoint_restore", path="ckpt/step_5", restore_s=RESTORE_S, step=SAVE_AT, layout_changed=False)
    restored = w.now
    w.steps(1, 6, STEPS, after_resume)
    w.end(1, digest)
    first_new_step_time = restored + STEP_S
    expected = {
        "fault_time": fault_time,
        "mttr_s": first_new_step_time - fault_time,
        "phases": {
            "detect": DETECT_S,
            "teardown": TEARDOWN_S,
            "relaunch": RELAUNCH_S,
            "restore": (restored - relaunch),
            "first_step": STEP_S,
        },
    }
    return w, expected


ROLES = {
    "reference": {"role": "reference"},
    "floor": {"role": "floor"},
    "floor-2": {"role": "floor"},
    "faulted": {"role": "faulted"},
    "ablation-all-on-hard": {"role": "ablation", "row": "all-on", "mode": "hard"},
    "ablation-rng-restore-off-hard": {"role": "ablation", "row": "rng-restore-off", "mode": "hard"},
}


def make_experiment(
    out: Path,
    floor_perturb: dict[int, float] | None = None,
    faulted_perturb: dict[int, float] | None = None,
    all_on_perturb: dict[int, float] | None = None,
) -> dict:
    floor_digest = "digest-floor" if floor_perturb else "digest-final"
    runs: dict[str, RunWriter] = {"reference": clean_run(), "floor": clean_run(floor_perturb, floor_digest)}
    if floor_perturb:  # a nonzero floor needs two distinct repeats before it judges anything
        runs["floor-2"] = clean_run({s: -0.7 * d for s, d in floor_perturb.items()}, "digest-floor-2")
    runs["faulted"], expected = faulted_run(
        faulted_perturb, "digest-x" if faulted_perturb else "digest-final"
    )
    runs["ablation-all-on-hard"], _ = faulted_run(
        all_on_perturb, "digest-y" if all_on_perturb else "digest-final"
    )
    runs["ablation-rng-restore-off-hard"], _ = faulted_run(
        {s: 1e-3 * (s - 5) for s in range(6, STEPS + 1)}, digest="digest-other"
    )
    for name, w in runs.items():
        w.write(out / "runs" / name)
    jobs = [{"name": n, **ROLES[n]} for n in runs]
    (out / "experiment.json").write_text(json.dumps({"jobs": jobs}))
    return expected


def strip_data_uris(text: str) -> str:
    return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text)


def test_report_on_exact_floor(tmp_path: Path) -> None:
    expected = make_experiment(tmp_path)
    summary = summarize(tmp_path)
    [group] = summary.groups
    runs = group.runs

    # The analysis itself, on numbers known by construction.
    assert group.floor.bitwise and group.floor.max_dloss == 0.0 and group.floor.source == "measured"
    faulted = runs["faulted"]
    counted = (
        "10/10 steps, 0/0 checkpoints, final parameters (logged digests only: no checkpoint re-read), "
        "1 pre-fault line re-checked"
    )
    assert faulted.verdict.label == f"bitwise: {counted}" and faulted.comparison.first_divergent_step is None
    assert faulted.comparison.fraction_bitwise_equal == 1.0
    assert faulted.comparison.digests[STEPS] is True
    assert faulted.resumes == 1
    (incident,) = faulted.incidents
    assert incident.kind == "kill" and incident.pre_fault_step == 6
    assert incident.mttr_s == pytest.approx(expected["mttr_s"])
    for phase, value in expected["phases"].items():
        assert incident.phases_s[phase] == pytest.approx(value), phase
    gp = faulted.goodput
    assert gp.badput_s["lost_work"] == pytest.approx(STEP_S)
    assert gp.badput_s["detection"] == pytest.approx(DETECT_S)
    assert gp.badput_s["teardown"] == pytest.approx(TEARDOWN_S)
    assert gp.badput_s["restore"] == pytest.approx(RESTORE_S)
    assert gp.useful_s + sum(gp.badput_s.values()) == pytest.approx(gp.wall_s)
    diverged = runs["ablation-rng-restore-off-hard"]
    assert diverged.comparison.first_divergent_step == 6
    assert diverged.verdict.label == "VIOLATED at step 6 (loss)"
    cells = {(c.row, c.mode): c for c in group.cells}
    assert cells[("rng-restore-off", "hard")].flagged is True
    assert cells[("all-on", "hard")].flagged is False
    assert summary.verdict.head == "PASS" and summary.verdict.exit_code == 0

    md_path, html_path = write_report(tmp_path, summary)
    assert (md_path, html_path) == (tmp_path / "report.md", tmp_path / "report.html")
    md = md_path.read_text()
    assert "**PASS.**" in md
    assert "**Recovery was correct:**" in md
    assert f"bitwise equal to the reference in everything compared ({counted})" in md
    assert f"| `faulted` | 1 | 1 | bitwise: {counted} |" in md
    assert "## What this verdict cannot see" in md and "A bug confined to one small tensor" in md
    assert "| `ablation-rng-restore-off-hard` | 1 | 1 | VIOLATED at step 6 (loss) | - | 6 | 6 |" in md
    assert "**FLAGGED** (VIOLATED at step 6 (loss))" in md
    assert "rng-restore-off/hard (VIOLATED at step 6 (loss))" in md
    assert fmt_seconds(incident.mttr_s) in md
    assert fmt_rate(gp.correct_tokens_per_s) in md
    assert "## Checkpoint overhead" in md and "## Ablation" in md and "## Floor" in md

    # Every image the Markdown links exists and is a real PNG.
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    names = {Path(link).name for link in links}
    for name in (
        "loss-faulted.png",
        "deviation-faulted.png",
        "timeline-faulted.png",
        "envelope-main.png",
        "deviation-ablation-rng-restore-off-hard.png",
        "ablation-main.png",
    ):
        assert name in names, name
    for link in links:
        png = tmp_path / link
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000, link

    html = html_path.read_text()
    assert html.count("data:image/png;base64,") == len(links)
    rest = strip_data_uris(html)
    assert "http" not in rest
    assert "<link" not in rest and "<script" not in rest and "url(" not in rest
    sources = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert len(sources) == len(links) and all(src.startswith("data:image/png;base64,") for src in sources)
    assert "VIOLATED at step 6 (loss)" in rest and "<table>" in rest


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_report_on_measured_floor(tmp_path: Path) -> None:
    """A nonzero floor of two distinct repeats: the faulted run differs bitwise but stays within the
    threshold at every step. Its final parameters cannot be judged there (no checkpoints in a hand-made
    run, and a digest says nothing at a nonzero floor), so it is not a pass: INCOMPLETE, exit 8, and the
    report names the missing evidence (issue 29)."""
    make_experiment(tmp_path, floor_perturb={3: 1e-5, 8: -1e-5}, faulted_perturb={7: 1.5e-5})
    summary = summarize(tmp_path)
    [group] = summary.groups
    faulted = group.runs["faulted"]
    assert not group.floor.bitwise and group.floor.k == 2
    assert "calibrated over 2 distinct repeats" in group.floor.label
    assert faulted.comparison.first_divergent_step == 7 and faulted.verdict.violation is None
    assert faulted.verdict.label.startswith("INCOMPLETE: final parameters not compared at step 10")
    assert summary.verdict.head == "INCOMPLETE" and summary.verdict.exit_code == 8
    md_path, html_path = write_report(tmp_path, summary)
    md = md_path.read_text()
    assert "**INCOMPLETE.**" in md and "**Recovery could not be verified:**" in md
    assert "first bitwise difference at step 7" in md
    assert "`faulted`: final parameters not compared at step 10" in md  # in "what this verdict cannot see"
    assert (tmp_path / "plots" / "deviation-faulted.png").read_bytes()[:8] == PNG_MAGIC
    assert "http" not in strip_data_uris(html_path.read_text())


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_a_flagged_all_on_cell_fails_the_report_and_the_exit_code(tmp_path: Path) -> None:
    """Issue 11, hole 5: `report` (like `experiment`) exits 1 exactly when the report opens with FAIL."""
    make_experiment(tmp_path, all_on_perturb={8: 1e-4})
    summary = summarize(tmp_path)
    assert summary.verdict.head == "FAIL" and summary.verdict.exit_code == 1
    proc = subprocess.run(
        [sys.executable, "-m", "truestep", "report", str(tmp_path)],
        env=truestep_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stderr
    md = (tmp_path / "report.md").read_text()
    assert "## Verdict\n\n**FAIL.**" in md and "all-on `ablation-all-on-hard` VIOLATED at step 8 (loss)" in md


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_figures_draw_what_the_analysis_computed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 11, hole 8: the deviation figure is handed the run's Comparison and verdict, the timeline its
    Goodput spans; nothing is re-derived from the logs."""
    from truestep.analysis.report import plots

    make_experiment(tmp_path)
    summary = summarize(tmp_path)
    seen: dict[str, tuple] = {}
    deviation, timeline = plots.plot_deviation, plots.plot_timeline

    def spy_deviation(c, f, v, *rest):
        seen.setdefault("dev", (c, f, v))
        return deviation(c, f, v, *rest)

    def spy_timeline(g, *rest):
        seen.setdefault("tl", (g,))
        return timeline(g, *rest)

    monkeypatch.setattr(plots, "plot_deviation", spy_deviation)
    monkeypatch.setattr(plots, "plot_timeline", spy_timeline)
    write_report(tmp_path, summary)
    faulted = summary.groups[0].runs["faulted"]
    assert seen["dev"][0] is faulted.comparison and seen["dev"][2] is faulted.verdict
    assert seen["dev"][1] is summary.groups[0].floor
    assert seen["tl"][0] is faulted.goodput


def test_render_run_text(tmp_path: Path) -> None:
    make_experiment(tmp_path)
    runs = summarize(tmp_path).groups[0].runs
    text = render_run_text(runs["faulted"])
    assert text.splitlines()[0].startswith("faulted: bitwise")
    assert "kill at step 6" in text and "resume@5" in text and "lost work" in text
    only = render_run_text(runs["ablation-rng-restore-off-hard"], sections=["fidelity"])
    assert "VIOLATED at step 6 (loss)" in only and "first divergent 6" in only and "goodput" not in only
    with pytest.raises(ValueError):
        render_run_text(runs["faulted"], sections=["nope"])
    assert render_run_text(runs["reference"]).startswith("reference: no reference")


def test_plots_edge_cases(tmp_path: Path) -> None:
    from truestep.analysis.report import plots

    # A run that stops early with a NaN loss: missing steps and a non-finite deviation still draw.
    ref = clean_run()
    short = RunWriter()
    short.launch(0)
    short.steps(0, 1, 4)
    short.metrics[-1]["loss"] = math.nan
    ref_log = RunLog.load(ref.write(tmp_path / "ref"))
    short_log = RunLog.load(short.write(tmp_path / "short"))
    floor = measure_floor(ref_log, [])
    c = compare(short_log, ref_log)
    out = plots.plot_deviation(c, floor, judge(c, floor), [], tmp_path / "dev.png", "short")
    assert out.read_bytes()[:8] == PNG_MAGIC
    gp = goodput(short_log, None)
    assert plots.plot_timeline(gp, [], tmp_path / "tl.png", "short").stat().st_size > 1000


def test_an_experiment_written_before_roles_and_a_name_that_escapes(tmp_path: Path) -> None:
    """experiment.json names only the jobs (the format before roles): roles come from the names. A job
    name that is a path is refused before anything is read."""
    make_experiment(tmp_path)
    made = [n for n in ROLES if (tmp_path / "runs" / n).is_dir()]
    (tmp_path / "experiment.json").write_text(json.dumps({"jobs": [{"name": n} for n in made]}))
    summary = summarize(tmp_path)
    assert [c.row for c in summary.groups[0].cells] == ["all-on", "rng-restore-off"]
    (tmp_path / "experiment.json").write_text(
        json.dumps({"jobs": [{"name": "../../etc", "role": "reference"}]})
    )
    with pytest.raises(RunLogError, match="not a plain directory name"):
        summarize(tmp_path)
