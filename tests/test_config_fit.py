"""Small runs just work (issue 24): a preset's warm-up shrinks to fit a short train.max_steps, with a
note; a warm-up the user set on the command line is never changed (and refused if it cannot fit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import metrics, run_in_process
from truestep.config.errors import ConfigError
from truestep.config.load import load_config
from truestep.train.schedule import lr_at


def test_a_presets_warmup_fits_itself_to_a_three_step_run_with_a_note(capsys) -> None:
    cfg = load_config("tiny", ["--train.max_steps=3"])
    assert cfg.schedule.warmup_steps == 1
    assert capsys.readouterr().err == (
        "truestep: note: train.max_steps=3 is shorter than the schedule's warm-up; fitted: "
        "schedule.warmup_steps 5 -> 1 (set --schedule.warmup_steps to choose)\n"
    )
    # The schedule of the fitted run: warm-up to the peak at step 0, then cosine to the floor.
    assert lr_at(0, cfg) == cfg.optim.lr
    assert lr_at(2, cfg) == cfg.optim.lr * cfg.schedule.min_lr_ratio


def test_a_warmup_set_on_the_command_line_is_the_users_and_is_refused() -> None:
    with pytest.raises(ConfigError, match="schedule.warmup_steps=5 must fit in train.max_steps=3"):
        load_config("tiny", ["--train.max_steps=3", "--schedule.warmup_steps=5"])


def test_a_wsd_decay_and_warmup_both_fit() -> None:
    cfg = load_config("tiny", ["--train.max_steps=4", "--schedule.kind=wsd"])
    assert cfg.schedule.decay_steps_for(4) == 1 and cfg.schedule.warmup_steps == 1


def test_a_run_long_enough_is_untouched(capsys) -> None:
    assert load_config("tiny", ["--train.max_steps=50"]).schedule.warmup_steps == 5
    assert capsys.readouterr().err == ""


def test_only_rank_0_says_the_note(monkeypatch, capsys) -> None:
    monkeypatch.setenv("RANK", "1")
    assert load_config("tiny", ["--train.max_steps=3"]).schedule.warmup_steps == 1
    assert capsys.readouterr().err == ""


def test_train_tiny_with_three_steps_trains_three_steps(tmp_path: Path) -> None:
    assert run_in_process(tmp_path, "--train.max_steps=3", "--checkpoint.interval=0") == 0
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2, 3]
