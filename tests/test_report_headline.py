"""The report read at a glance (issue 24): a headline block first (verdict, the rule in one sentence,
the scenario table, the ablation grid), every overlay plot draws the runs that matter or names what it
left out, legends sit outside the data, symbols are explained, each run lists its recovery path, and
the state-distance table ranks tensors that carry information. On tests/test_report.py's hand-made
experiment directories (no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from test_report import make_experiment  # noqa: E402
from truestep.analysis.report import figures, write_report  # noqa: E402
from truestep.analysis.report.format import fmt_pct  # noqa: E402
from truestep.analysis.report.sections import state_blocks  # noqa: E402
from truestep.analysis.state import StateDistance  # noqa: E402
from truestep.experiment.summary import summarize  # noqa: E402


def _report(out: Path) -> tuple[str, object]:
    summary = summarize(out)
    md, _ = write_report(out, summary)
    return md.read_text(), summary


def test_the_headline_comes_first_with_the_rule_the_scenarios_and_the_ablation_grid(tmp_path: Path) -> None:
    make_experiment(tmp_path)
    md, summary = _report(tmp_path)
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[:2] == ["## At a glance", "## Verdict"]
    glance = md.split("## At a glance", 1)[1].split("## Verdict", 1)[0]
    assert "**PASS**." in glance
    assert (
        "**The rule:** a run is correct while it stays bitwise equal to the failure-free reference in every "
        "observable, because the same-seed repeats were bitwise identical to it; the experiment passes when "
        "every faulted run and every all-on ablation cell is trajectory-preserving" in glance
    )
    group = summary.groups[0]
    faulted, reference = group.runs["faulted"], group.runs["reference"]
    share = fmt_pct(faulted.goodput.correct_tokens_per_s / reference.goodput.plain_tokens_per_s)
    assert (
        "| scenario | faults | verdict | first divergence | correct goodput, % of failure-free | MTTR |"
        in glance
    )
    assert f"| `faulted` | `kill:rank=0:step=6` | {faulted.verdict.label} | — | {share} |" in glance
    assert "| mechanism off \\ fault | hard |" in glance
    assert "| all-on | not flagged |" in glance
    assert "| rng-restore-off | **flagged** (VIOLATED at step 6 (loss)) |" in glance
    assert "∞ in a distance table" in glance and "margin: the factor" in glance


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_a_failed_experiment_says_why_in_the_headline(tmp_path: Path) -> None:
    make_experiment(tmp_path, all_on_perturb={7: 1e-3})
    md, _ = _report(tmp_path)
    glance = md.split("## At a glance", 1)[1].split("## Verdict", 1)[0]
    assert "**FAIL**: all-on `ablation-all-on-hard` VIOLATED at step 7 (loss)." in glance
    assert "| all-on | **flagged** (VIOLATED at step 7 (loss)) |" in glance


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_an_overlay_draws_violations_first_and_names_what_it_left_out(tmp_path: Path, monkeypatch) -> None:
    make_experiment(tmp_path)
    monkeypatch.setattr(figures, "MAX_RUNS_ON_ENVELOPE", 1)
    md, summary = _report(tmp_path)
    drawn, note = figures.runs_to_overlay(summary.groups[0])
    assert [name for name, _, _ in drawn] == ["ablation-rng-restore-off-hard"]  # the violation, not `faulted`
    assert note == "; not drawn (2, see the runs table): `faulted`, `ablation-all-on-hard`"
    assert "the runs (X: a loss violation); not drawn (2, see the runs table): `faulted`" in md
    monkeypatch.setattr(figures, "MAX_RUNS_ON_ENVELOPE", 8)
    assert figures.runs_to_overlay(summary.groups[0])[1] == ""


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_every_legend_sits_outside_the_data(tmp_path: Path, monkeypatch) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from truestep.analysis.report.plots import ablation, deviation, envelope, loss, style, timeline

    drawn = []

    def keep(fig, path):
        drawn.append(fig)
        return style.save_figure(fig, path)

    for module in (ablation, deviation, envelope, loss, timeline):
        monkeypatch.setattr(module, "save_figure", keep)
    make_experiment(tmp_path, faulted_perturb={8: 1e-3})
    _report(tmp_path)
    legends = 0
    for fig in drawn:
        FigureCanvasAgg(fig)
        fig.draw_without_rendering()
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is not None:
                legends += 1
                assert not legend.get_window_extent().overlaps(ax.get_window_extent()), ax.get_title()
    assert legends >= 5  # loss, deviation, timeline, envelope, ablation


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_each_run_lists_its_recovery_path(tmp_path: Path) -> None:
    make_experiment(tmp_path)
    events = tmp_path / "runs" / "faulted" / "events.jsonl"
    quarantine = {"time": 1001.0, "attempt": 1, "event": "checkpoint_quarantined", "step": 8}
    quarantine["reason"] = "missing COMMITTED"
    commit = {"time": 6.5, "attempt": 0, "event": "checkpoint_commit", "step": 5}
    with events.open("a") as f:
        f.write(json.dumps(quarantine) + "\n" + json.dumps(commit) + "\n")
    md, _ = _report(tmp_path)
    faulted = md.split("### Run `faulted`", 1)[1].split("### Run", 1)[0]
    assert "| attempt | what | step | detail |" in faulted
    assert (
        "| 1 | restored | 5 | from `step_5` in 0.200 s; committed: its checkpoint_commit event |" in faulted
    )
    assert "| 1 | quarantined | 8 | missing COMMITTED |" in faulted
    reference = md.split("### Run `reference`", 1)[1].split("### Run", 1)[0]
    assert "Recovery path: no checkpoint was restored, quarantined or set aside." in reference


def test_the_state_table_ranks_tensors_that_carry_information(tmp_path: Path) -> None:
    make_experiment(tmp_path)
    summary = summarize(tmp_path)
    group = summary.groups[0]
    run = group.runs["faulted"]
    tensors = {"step:w": 9.0, "exp_avg:w": 0.5, "params:w": math.inf}
    run.comparison.state = [StateDistance(5, {"params": math.inf, "exp_avg": 0.5, "step": 9.0}, tensors)]
    para, table = state_blocks(run, group.floor)
    assert table.headers == ["checkpoint step", "exp_avg", "params", "largest per-tensor distances"]
    assert table.rows[0][-1] == "`params:w` ∞, `exp_avg:w` 0.5"
    assert (
        "step counters are not listed" in para.text and "∞: a tensor held by one checkpoint only" in para.text
    )


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_at_a_measured_floor_the_rule_is_the_envelope_and_the_headline_says_incomplete(
    tmp_path: Path,
) -> None:
    make_experiment(tmp_path, floor_perturb={3: 1e-5, 8: -1e-5}, faulted_perturb={7: 1.5e-5})
    md, summary = _report(tmp_path)
    glance = md.split("## At a glance", 1)[1].split("## Verdict", 1)[0]
    assert f"**INCOMPLETE**: {'; '.join(summary.verdict.failures)}." in glance
    assert (
        "**The rule:** a run is correct while every observable stays within its threshold times the same-seed "
        "repeats' per-step envelope (the floor); the experiment passes when" in glance
    )
    assert "| `faulted` | `kill:rank=0:step=6` | INCOMPLETE: final parameters not compared" in glance
    assert "| 7 |" in glance  # the first divergence
