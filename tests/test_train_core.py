"""The trainer's observable contract: logs, accumulation, loss as a global mean, config errors early."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import events, launch, metrics, truestep_env
from truestep.config.load import load_config
from truestep.parallel.dist import DistContext
from truestep.parallel.grad_norm import clip_grad_norm

MAX = 6
COMMON = [f"--train.max_steps={MAX}", "--checkpoint.interval=0"]


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("single")
    launch(run, *COMMON)
    return run


@pytest.mark.multiprocess
def test_metrics_and_events_schema(single: Path) -> None:
    rows = metrics(single)
    assert [r["step"] for r in rows] == list(range(1, MAX + 1))
    for r in rows:
        for key in ("loss", "grad_norm", "lr", "step_time", "time", "mono"):
            assert isinstance(r[key], float), key
        assert r["attempt"] == 0 and r["tokens_seen"] == r["step"] * 8 * 32
    assert all(b["time"] >= a["time"] for a, b in zip(rows, rows[1:], strict=False))
    start = events(single, "run_start")[0]
    assert start["layout"] == {"world_size": 1, "dp": 1, "tp": 1, "backend": "none"}
    assert len(start["config_fingerprint"]) == 16 and start["num_threads"] == 1
    end = events(single, "run_end")[-1]
    assert end["reason"] == "completed" and len(end["param_digest"]) == 64
    assert (single / "config.toml").is_file()


@pytest.mark.multiprocess
def test_grad_accumulation_matches_full_batch(single: Path, tmp_path: Path) -> None:
    """FSDP x2 with 2 micro-batches of 2 per rank = the same global batch of 8 as one process."""
    launch(tmp_path, *COMMON, "--train.micro_batch_size=2", nproc=2)
    for a, b in zip(metrics(single), metrics(tmp_path), strict=True):
        assert abs(a["loss"] - b["loss"]) < 2e-5, (a["step"], a["loss"], b["loss"])


@pytest.mark.multiprocess
def test_logged_loss_is_global_mean_not_rank0(tmp_path: Path) -> None:
    """With dp=2 each rank sees different samples; the logged loss must equal the single-process loss
    of the whole batch, which rank 0's local loss alone would not."""
    one, two = tmp_path / "one", tmp_path / "two"
    one_step = ["--train.max_steps=1", "--schedule.warmup_steps=0", "--checkpoint.interval=0"]
    launch(one, *one_step)
    launch(two, *one_step, nproc=2)
    assert abs(metrics(one)[0]["loss"] - metrics(two)[0]["loss"]) < 1e-6


@pytest.mark.multiprocess
def test_bad_layout_rejected_before_process_group(tmp_path: Path) -> None:
    heads = ["--model.n_heads=8", "--model.n_kv_heads=4"]  # divisible by tp=4: only the world size is wrong
    proc = launch(tmp_path, *heads, "--parallel.tp=4", nproc=2, check=False, timeout=120)
    assert proc.returncode != 0
    assert "not divisible by parallel.tp=4" in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.multiprocess
def test_unknown_override_is_a_config_error(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "truestep", "train", "tiny", f"--run.dir={tmp_path}", "--train.max_step=3"]
    proc = subprocess.run(cmd, env=truestep_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown key train.max_step" in proc.stderr and "max_steps" in proc.stderr


@pytest.mark.multiprocess
def test_vocab_too_small_for_data(tmp_path: Path) -> None:
    proc = launch(tmp_path, "--model.vocab_size=128", check=False, timeout=120)
    assert proc.returncode != 0 and "exceeds model.vocab_size=128" in proc.stderr


def test_grad_clip_matches_torch_single_process() -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(5, 7), torch.nn.Linear(5, 7)
    b.load_state_dict(a.state_dict())
    a(torch.randn(3, 5)).pow(2).sum().backward()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        pb.grad = pa.grad.clone()
    ours = clip_grad_norm(list(a.parameters()), 0.5, DistContext())
    theirs = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.5)
    assert torch.allclose(ours, theirs)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-7)


def test_tiny_preset_is_valid_and_small() -> None:
    from truestep.model.llama import count_parameters

    cfg = load_config("tiny")
    assert 100_000 < count_parameters(cfg.model) < 10_000_000
