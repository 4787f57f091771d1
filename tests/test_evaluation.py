"""Held-out evaluation (eval.*): every K steps, the loss and perplexity on a fixed set of windows from a
second prepared directory; it does not change the trajectory, an evaluation after a resume equals the
uninterrupted run's at the same step bit for bit, and the number is the model's true held-out loss."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness import INPROCESS_JOB, TINY, bits, events, loss_bits_by_step, run_in_process
from truestep.analysis.report import render_run_text
from truestep.analysis.report.markdown import render_markdown
from truestep.analysis.report.training import training_blocks
from truestep.analysis.runlog import RunLog
from truestep.analysis.summary import analyze_run
from truestep.checkpoint.weights import load_model_tensors
from truestep.config.errors import ConfigError
from truestep.config.load import load_config
from truestep.core.errors import ExitCode
from truestep.data import TokenDataset, prepare_data
from truestep.model.llama import Transformer

EVAL = ["--eval.every_steps=2", "--eval.samples=6", "--eval.batch_size=4"]


@pytest.fixture(scope="module")
def held_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Text the demo corpus does not hold, prepared with the same (byte) tokenizer."""
    base = tmp_path_factory.mktemp("held-out")
    text = base / "held_out.txt"
    text.write_text(
        "\n".join(json.dumps({"line": i, "square": i * i, "word": "abcdefg"[i % 7]}) for i in range(400))
    )
    prepare_data([text], base / "data", tokenizer_spec="byte")
    return base / "data"


def _evals(run: Path) -> dict[int, dict]:
    return {e["step"]: e for e in events(run, "eval")}


def test_evaluation_changes_nothing_and_resumes_bit_for_bit(
    held_out: Path, inprocess_reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = [*EVAL, f"--eval.path={held_out}"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert run_in_process(whole, *INPROCESS_JOB, *ev) == 0
    assert loss_bits_by_step(whole) == loss_bits_by_step(inprocess_reference), (
        "evaluation moved the trajectory"
    )
    assert sorted(_evals(whole)) == [2, 4, 6, 8]
    said = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("truestep train: eval at step")
    ]
    assert len(said) == 4 and "perplexity" in said[0], said

    assert run_in_process(resumed, *INPROCESS_JOB, *ev, "--train.stop_at_step=3") == 0
    assert run_in_process(resumed, *INPROCESS_JOB, *ev) == 0
    assert events(resumed, "checkpoint_restore")[-1]["step"] == 3
    a, b = _evals(whole), _evals(resumed)
    assert sorted(b) == [2, 4, 6, 8]
    for step in (2, 4, 6, 8):  # 4, 6, 8 evaluated after the resume
        assert bits(a[step]["loss"]) == bits(b[step]["loss"]), step
        assert a[step]["loss"] == b[step]["loss"] and a[step]["perplexity"] == b[step]["perplexity"]
    assert a[8]["loss"] < a[2]["loss"], "the model learns text in general: held-out loss falls"
    assert math.isclose(a[8]["perplexity"], math.exp(a[8]["loss"]), rel_tol=1e-12)

    # The report and the run text carry the evaluations and the memory per rank.
    analysis = analyze_run("resumed", RunLog.load(resumed), None, None)
    assert analysis.evals == [(s, b[s]["loss"], b[s]["perplexity"]) for s in (2, 4, 6, 8)]
    assert len(analysis.peak_mem_bytes_per_rank) == 1 and analysis.memory_estimate_bytes
    md = render_markdown(training_blocks(analysis), tmp_path)
    assert (
        "#### Held-out evaluation" in md
        and f"| 8 | {b[8]['loss']:.4f} |" in md
        and "measured peak, rank 0" in md
    )
    text = render_run_text(analysis, sections=["training"])
    assert f"step 8: held-out loss {b[8]['loss']:.4f}" in text and "measured peak GiB: rank 0" in text


def test_the_evaluation_is_the_models_held_out_loss(held_out: Path, tmp_path: Path) -> None:
    """Recomputed outside the trainer from the checkpoint at the same step: the same mean token loss."""
    run = tmp_path / "run"
    assert (
        run_in_process(
            run, "--train.max_steps=4", "--schedule.warmup_steps=1", *EVAL, f"--eval.path={held_out}"
        )
        == 0
    )
    cfg = load_config("tiny", [*TINY])
    model = Transformer(cfg.model)
    model.init_weights(0)
    load_model_tensors(run / "checkpoints" / "step_00000004", into=dict(model.state_dict()))
    model.eval()
    windows = torch.from_numpy(TokenDataset(held_out, cfg.data.seq_len).samples(list(range(6))))
    with torch.no_grad():
        logits = model(windows[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten(), reduction="sum").double()
    expected = float(loss / windows[:, 1:].numel())
    assert math.isclose(_evals(run)[4]["loss"], expected, rel_tol=1e-6), (_evals(run)[4]["loss"], expected)
    assert _evals(run)[4]["tokens"] == 6 * cfg.data.seq_len


def test_bad_evaluation_settings_are_one_line_and_exit_2(
    held_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="needs eval.path"):  # the CLI's exit 2
        load_config("tiny", ["--eval.every_steps=2"])
    assert (
        run_in_process(
            tmp_path / "b", "--eval.every_steps=2", f"--eval.path={held_out}", "--eval.samples=100000"
        )
        == ExitCode.USAGE
    )
    err = capsys.readouterr().err
    assert "eval.samples=100000 but" in err and "Traceback" not in err
