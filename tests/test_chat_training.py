"""Fine-tuning on chat data (prepare-data --chat): the loss is the mean over the assistant's tokens only,
the same for any micro-batch split and data-parallel layout, evaluation masks the same way, and a resumed
run is the uninterrupted one bit for bit (losses, evaluations, weights, and the stop witness's verdict)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from chat_cases import conversations, write_chat_tokenizer, write_chats
from harness import (
    INPROCESS_JOB,
    TINY,
    bits,
    events,
    final_digest,
    launch,
    loss_bits_by_step,
    metrics,
    run_in_process,
)
from truestep.checkpoint.weights import load_model_tensors
from truestep.config.errors import ConfigError
from truestep.config.load import load_config
from truestep.data.build import build_loader
from truestep.data.dataset import TokenDataset
from truestep.data.mixture import MixtureLoader
from truestep.data.shards import ChatOptions, prepare_data
from truestep.model.llama import Transformer
from truestep.parallel.dist import DistContext
from truestep.train.evaluation import Evaluator

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

EVAL = ["--eval.every_steps=2", "--eval.samples=6", "--eval.batch_size=4"]


@pytest.fixture(scope="module")
def chats(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(training chats, held-out chats), packed for TINY's data.seq_len of 32, each ending with a user
    turn after the last answer (tokens the mask must leave out); the few longer than a window skipped."""
    base = tmp_path_factory.mktemp("chats")
    tok = write_chat_tokenizer(base / "tok")
    train = write_chats(base / "train.jsonl", conversations(160, seed=0, trailing_user=True))
    held = write_chats(base / "held.jsonl", conversations(40, seed=1, trailing_user=True))
    return (
        prepare_data([train], base / "train", str(tok), chat=ChatOptions(32), skip_bad=True),
        prepare_data([held], base / "held", str(tok), chat=ChatOptions(32), skip_bad=True),
    )


def _model_at(checkpoint: Path) -> Transformer:
    model = Transformer(load_config("tiny", [*TINY]).model)
    model.init_weights(0)
    load_model_tensors(checkpoint, into=dict(model.state_dict()))
    return model


def _mean(model: Transformer, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(inputs)
        return float(F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="mean"))


def test_the_loss_is_the_mean_over_the_assistants_tokens(chats: tuple[Path, Path], tmp_path: Path) -> None:
    """Recomputed outside the trainer from the checkpoint before the step, on the loader's batch: the
    logged training loss and the evaluation are the mean over trained targets, not over all of them."""
    train, held = chats
    run = tmp_path / "run"
    job = ["--train.max_steps=3", "--checkpoint.interval=2", "--schedule.warmup_steps=1"]
    assert run_in_process(run, *job, f"--data.path={train}", *EVAL, f"--eval.path={held}") == 0
    model = _model_at(run / "checkpoints" / "step_00000002")

    cfg = load_config("tiny", [*TINY, f"--data.path={train}"])
    loader = build_loader(cfg.data, cfg.train.global_batch_size, cfg.train.global_batch_size, 0, 1)
    assert loader.loss_masked
    ((inputs, targets),) = loader.batch_for(2)  # the batch of step 3
    trained = targets != -100
    assert 0 < int(trained.sum()) < targets.numel() // 2, "the test needs a mask that leaves most out"
    rows = torch.from_numpy(TokenDataset(train, 32).samples(loader.sampler.rank_indices(2, 0, 1)))
    assert torch.equal(inputs, rows[:, :-1]) and torch.equal(targets[trained], rows[:, 1:][trained])
    model.train()  # as the step ran (the tiny model has no dropout: train mode is deterministic)
    masked = _mean(model, inputs, targets)
    logged = {m["step"]: m["loss"] for m in metrics(run)}[3]
    assert math.isclose(logged, masked, rel_tol=1e-5), (logged, masked)
    unmasked = _mean(model, inputs, rows[:, 1:])
    assert not math.isclose(logged, unmasked, rel_tol=1e-2), "the loss did not depend on the mask"

    model.eval()
    windows = TokenDataset(held, 32)
    rows = torch.from_numpy(windows.samples(list(range(6))))
    kept = torch.from_numpy(windows.masks(list(range(6)))[:, 1:] != 0)
    evaluated = {e["step"]: e for e in events(run, "eval")}[2]
    expected = _mean(model, rows[:, :-1], torch.where(kept, rows[:, 1:], -100))
    assert math.isclose(evaluated["loss"], expected, rel_tol=1e-5), (evaluated["loss"], expected)
    assert evaluated["tokens"] == int(kept.sum()) < kept.numel()


def test_the_loss_does_not_depend_on_the_micro_batch_split(chats: tuple[Path, Path], tmp_path: Path) -> None:
    """Micro-batches hold different numbers of trained tokens: a mean of their means would change with
    the split; the mean over the global batch's trained tokens does not (up to summation order)."""
    train, _ = chats
    losses = {}
    for micro in (8, 2, 1):
        run = tmp_path / f"micro{micro}"
        assert (
            run_in_process(
                run, "--train.max_steps=1", f"--data.path={train}", f"--train.micro_batch_size={micro}"
            )
            == 0
        )
        losses[micro] = metrics(run)[0]["loss"]
    assert math.isclose(losses[8], losses[2], rel_tol=1e-6) and math.isclose(
        losses[8], losses[1], rel_tol=1e-6
    ), losses


def test_a_resumed_fine_tune_is_the_uninterrupted_one_bit_for_bit(
    chats: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train, held = chats
    job = [*INPROCESS_JOB, f"--data.path={train}", "--train.micro_batch_size=2", *EVAL, f"--eval.path={held}"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert run_in_process(whole, *job) == 0
    assert run_in_process(resumed, *job, "--train.stop_at_step=3") == 0
    assert run_in_process(resumed, *job) == 0
    assert events(resumed, "checkpoint_restore")[-1]["step"] == 3
    assert loss_bits_by_step(resumed) == loss_bits_by_step(whole) and len(loss_bits_by_step(whole)) == 8
    assert final_digest(resumed) == final_digest(whole)
    evals = [{e["step"]: bits(e["loss"]) for e in events(run, "eval")} for run in (whole, resumed)]
    assert evals[0] == evals[1] and sorted(evals[0]) == [2, 4, 6, 8]
    # The stop witness computes the next step's loss as the step does (masked): the resume is verified.
    (verdict,) = [e for e in events(resumed) if e["event"].startswith("resume_")]
    assert verdict["event"] == "resume_verified" and verdict["witness"] is True, verdict
    assert "resume verified against the stop witness: step 4 bit for bit" in capsys.readouterr().err


def test_held_out_chats_without_a_trained_token_are_refused(tmp_path: Path) -> None:
    tok = write_chat_tokenizer(tmp_path / "tok")
    users = [[{"role": "user", "content": "the cat"}] for _ in range(8)]  # padded: a window each
    held = prepare_data(
        [write_chats(tmp_path / "u.jsonl", users)], tmp_path / "u", str(tok), chat=ChatOptions(32, "pad")
    )
    cfg = load_config("tiny", [*TINY, *EVAL, f"--eval.path={held}"])
    with pytest.raises(ConfigError, match="train no token"):
        Evaluator(cfg, DistContext(), cfg.model.vocab_size)
    assert not np.load(held / "mask_00000.npy").any()


@pytest.mark.multiprocess
def test_two_data_parallel_ranks_compute_the_single_process_loss(
    chats: tuple[Path, Path], tmp_path: Path
) -> None:
    """Each rank holds a different number of trained tokens: the divisor is their sum over the ranks
    (one all-reduce), and FSDP's gradient average is undone by the dp factor."""
    train, _ = chats
    job = [
        "--train.max_steps=3",
        "--checkpoint.interval=0",
        "--schedule.warmup_steps=1",
        f"--data.path={train}",
    ]
    launch(tmp_path / "one", *job)
    launch(tmp_path / "two", *job, nproc=2)
    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    for a, b in zip(one, two, strict=True):
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-5), (a, b)
        assert math.isclose(a["grad_norm"], b["grad_norm"], rel_tol=1e-4), (a, b)


def test_a_mixture_masks_its_chat_source_only(chats: tuple[Path, Path], tmp_path: Path) -> None:
    """A chat source mixed with plain text: the chat rows' untrained targets are ignored, the text rows
    train every token (a source without a mask is pretraining data)."""
    train, _ = chats
    text = tmp_path / "t.jsonl"
    text.write_text("".join(json.dumps({"text": "the cat sat on the mat " * 3}) + "\n" for _ in range(40)))
    plain = prepare_data([text], tmp_path / "plain", str(train / "tokenizer.json"))
    mix = MixtureLoader([("chat", 0.5, train), ("plain", 0.5, plain)], 32, 8, 7, 0, 1, 8)
    assert mix.loss_masked
    rows = torch.cat([targets for _ in range(4) for _, targets in mix.next()])
    ignored = (rows == -100).sum(dim=1)  # every conversation has a user turn: a chat row ignores some
    assert (ignored == 0).any() and (ignored > 0).any(), ignored
