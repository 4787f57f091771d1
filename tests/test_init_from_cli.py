"""`checkpoint.init_from` on the console: a refusal is one line on stderr with exit 3 (a config error the
user fixes), never a traceback; weights loaded into a model with other RoPE/norm settings print a
warning on rank 0's stderr, not only in the event log. Real `truestep train` processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import launch, read_jsonl

pytestmark = pytest.mark.multiprocess

SHORT = ["--train.max_steps=1", "--checkpoint.interval=0", "--schedule.warmup_steps=0"]


def _train(run: Path, *overrides: str, nproc: int = 1):
    return launch(run, *SHORT, *overrides, nproc=nproc, check=False)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["--model.n_kv_heads=4"],
            "layers.0.attention.wk.weight: checkpoint has [32, 64], model expects [64, 64]",
        ),
    ],
)
def test_a_refused_init_from_is_one_line_and_exit_3(
    overrides: list[str], message: str, ckpt, tmp_path
) -> None:
    proc = _train(tmp_path / "run", f"--checkpoint.init_from={ckpt}", *overrides)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"truestep train: checkpoint.init_from={ckpt} does not fit")
    assert message in lines[0] and "--model.n_kv_heads=2" in lines[0]  # what the checkpoint needs


def test_a_missing_or_unverified_init_from_is_one_line(ckpt, tmp_path: Path) -> None:
    proc = _train(tmp_path / "a", f"--checkpoint.init_from={tmp_path / 'nope'}")
    assert proc.returncode == 3 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "checkpoint.init_from=" in proc.stderr and "no such checkpoint directory" in proc.stderr
    empty = tmp_path / "empty"
    (empty / "checkpoints" / "step_00000001").mkdir(parents=True)  # nothing in it verifies
    proc = _train(tmp_path / "b", f"--checkpoint.init_from={empty}")
    assert proc.returncode == 3 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "verifies" in proc.stderr and "Traceback" not in proc.stderr


def test_numeric_differences_are_warned_on_rank_0(ckpt, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _train(run, f"--checkpoint.init_from={ckpt}", "--model.rope_theta=500000.0", nproc=2)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning: checkpoint.init_from" in line]
    assert len(warnings) == 1, proc.stderr  # rank 0 only
    assert "model.rope_theta: 10000.0 (checkpoint) -> 500000.0 (configured)" in warnings[0]
    (event,) = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "init_from"]
    assert event["config_differences"] == ["model.rope_theta: 10000.0 (checkpoint) -> 500000.0 (configured)"]


def test_rope_scaling_differences_are_reported(ckpt) -> None:
    import dataclasses

    from truestep.checkpoint.init_from import load_init_weights
    from truestep.checkpoint.weights import read_model_config
    from truestep.model.llama import Transformer

    cfg = dataclasses.replace(read_model_config(ckpt), rope_scaling="llama3", rope_scaling_factor=32.0)
    facts = load_init_weights(Transformer(cfg), ckpt)
    assert facts["config_differences"] == [
        "model.rope_scaling: 'none' (checkpoint) -> 'llama3' (configured)",
        "model.rope_scaling_factor: 8.0 (checkpoint) -> 32.0 (configured)",
    ]
    assert json.dumps(facts)  # the event log can hold it


def test_a_misfit_is_refused_before_the_model_is_built(ckpt, tmp_path: Path) -> None:
    """A configured model of ~4 TiB: refused from the meta-device comparison, never allocated."""
    huge = [
        "--model.dim=1048576",
        "--model.n_heads=1024",
        "--model.n_kv_heads=512",
        "--model.vocab_size=1048576",
    ]
    proc = _train(tmp_path / "run", f"--checkpoint.init_from={ckpt}", *huge)
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "does not fit the configured model" in line and "model expects [1048576, 1048576]" in line
