"""The cold path's start (issue 37): a resume draws no random init, a fresh start initializes once, in
O(shard) (any rectangle of a parameter is computed from its own tiles, bit for bit that part of the
whole), no step runs on weights neither initialized nor loaded, and every run reports its start-up
phases in `run_start`. The layouts themselves: tests/test_meta_init.py."""

from __future__ import annotations

import importlib
import math
import random
from pathlib import Path

import pytest
import torch

from harness import events, loss_bits_by_step, run_in_process
from truestep.model import init as model_init
from truestep.model.init import TILE_COLS, TILE_ROWS, blockwise_region

SHAPES = [(2 * TILE_ROWS + 5, 2 * TILE_COLS + 37), (TILE_ROWS - 3, 100), (1, 5), (3 * TILE_COLS + 1,)]


@pytest.mark.parametrize("shape", SHAPES)
def test_any_rectangle_is_that_part_of_the_whole_bit_for_bit(shape: tuple[int, ...]) -> None:
    whole = blockwise_region(3, "layers.0.attention.wq.weight", shape, 0.02, [0] * len(shape), shape)
    rng = random.Random(7)
    for _ in range(25):
        start = [rng.randrange(n) for n in shape]
        size = [rng.randrange(1, n - s + 1) for s, n in zip(start, shape, strict=True)]
        part = blockwise_region(3, "layers.0.attention.wq.weight", shape, 0.02, start, size)
        expected = whole[tuple(slice(s, s + n) for s, n in zip(start, size, strict=True))]
        assert torch.equal(part.view(torch.int32), expected.contiguous().view(torch.int32)), (start, size)


def test_each_tile_is_a_fresh_generators_draw_and_a_part_draws_only_its_tiles(monkeypatch) -> None:
    """The scheme's definition: tile (i, j) of parameter p is torch.randn(tile shape) from a new generator
    seeded with tile_seed(seed, p, i, j), times the std. Reused buffers and generators must not change
    a bit of it, and a rectangle draws only the tiles it touches."""
    shape = (2 * TILE_ROWS + 3, TILE_COLS + 7)
    expected = torch.empty(shape)
    for i in range(3):
        for j in range(2):
            rows, cols = min(TILE_ROWS, shape[0] - i * TILE_ROWS), min(TILE_COLS, shape[1] - j * TILE_COLS)
            gen = torch.Generator().manual_seed(model_init.tile_seed(1, "a.weight", i, j))
            block = expected[i * TILE_ROWS : i * TILE_ROWS + rows, j * TILE_COLS : j * TILE_COLS + cols]
            block.copy_(torch.randn((rows, cols), generator=gen))
    expected.mul_(0.5)
    got = blockwise_region(1, "a.weight", shape, 0.5, (0, 0), shape)
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
    assert not torch.equal(got, blockwise_region(2, "a.weight", shape, 0.5, (0, 0), shape))
    assert not torch.equal(got, blockwise_region(1, "b.weight", shape, 0.5, (0, 0), shape))
    assert not torch.equal(got[:TILE_ROWS, :TILE_COLS], got[TILE_ROWS : 2 * TILE_ROWS, :TILE_COLS])
    big = blockwise_region(
        1, "a.weight", (64 * TILE_ROWS, TILE_COLS), 1.0, (0, 0), (64 * TILE_ROWS, TILE_COLS)
    )
    assert abs(float(big.std()) - 1.0) < 0.01 and abs(float(big.mean())) < 0.01

    drawn: list[tuple[int, int]] = []
    real = model_init.tile_seed
    monkeypatch.setattr(model_init, "tile_seed", lambda s, n, i, j: drawn.append((i, j)) or real(s, n, i, j))
    blockwise_region(1, "a.weight", shape, 1.0, (TILE_ROWS, 0), (TILE_ROWS, TILE_COLS + 1))
    assert drawn == [(1, 0), (1, 1)]  # the two tiles it touches, no more


def test_the_full_scheme_is_the_old_init_bit_for_bit() -> None:
    """`train.init_scheme=full` reproduces runs started before round 3: one generator, parameters in
    order, norms ones (no draw), output projections scaled by 1/sqrt(2 n_layers)."""
    from truestep.config import load_config
    from truestep.model.llama import Transformer

    cfg = load_config("tiny", ["--model.n_layers=2", "--model.dim=64", "--model.vocab_size=300"]).model
    model = Transformer(cfg)
    model.init_weights(5, "full")
    gen = torch.Generator().manual_seed(5)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(param, torch.ones_like(param)), name
            continue
        scale = 1 / math.sqrt(2 * cfg.n_layers) if name.endswith(("wo.weight", "w2.weight")) else 1.0
        expected = torch.randn(param.shape, generator=gen).mul_(cfg.init_std * scale)
        assert torch.equal(param.detach().view(torch.int32), expected.view(torch.int32)), name
    blockwise = Transformer(cfg)
    blockwise.init_weights(5)
    assert not torch.equal(blockwise.tok_embeddings.weight, model.tok_embeddings.weight)


def _count_inits(monkeypatch) -> list[str]:
    """Every call of the parameter init, by the trainer or anyone (the two names of one function)."""
    parallelize = importlib.import_module("truestep.parallel.parallelize")  # the package shadows it
    trainer = importlib.import_module("truestep.train.trainer")

    calls: list[str] = []
    real = parallelize.init_parameters

    def counted(model, seed, scheme="blockwise"):
        calls.append(scheme)
        real(model, seed, scheme)

    monkeypatch.setattr(parallelize, "init_parameters", counted)
    monkeypatch.setattr(trainer, "init_parameters", counted)
    return calls


def test_a_resume_draws_no_init_and_a_fresh_start_draws_one(tmp_path: Path, monkeypatch) -> None:
    calls = _count_inits(monkeypatch)
    reference = tmp_path / "reference"
    assert run_in_process(reference, "--train.max_steps=4", "--checkpoint.interval=0") == 0
    assert calls == ["blockwise"]
    calls.clear()
    run = tmp_path / "run"
    assert (
        run_in_process(run, "--train.max_steps=4", "--train.stop_at_step=2", "--checkpoint.interval=2") == 0
    )
    assert calls == ["blockwise"]
    calls.clear()

    def no_init(*args, **kwargs):
        raise AssertionError("a resume drew a random init")

    import truestep.model.llama as llama

    monkeypatch.setattr(llama, "fill_blockwise", no_init)
    monkeypatch.setattr(llama.Transformer, "initial_values", no_init)
    monkeypatch.setattr(importlib.import_module("truestep.parallel.parallelize"), "fill_blockwise", no_init)
    assert run_in_process(run, "--train.max_steps=4", "--checkpoint.interval=2") == 0
    assert calls == []
    assert loss_bits_by_step(run) == loss_bits_by_step(reference)  # it loaded every parameter

    starts = events(run, "run_start")
    fresh, resumed = starts[0]["startup_phases"], starts[1]["startup_phases"]
    assert list(fresh) == list(resumed) == ["import", "build", "init", "verify", "load"]
    assert fresh["init"] > 0 and fresh["verify"] == 0 and fresh["load"] == 0, fresh
    assert resumed["init"] == 0 and resumed["verify"] > 0 and resumed["load"] > 0, resumed
    assert fresh["build"] > 0 and resumed["build"] > 0


def test_no_step_runs_on_weights_neither_initialized_nor_loaded(tmp_path: Path) -> None:
    """A Trainer only allocates: a step before `initialize` (or a whole load) is refused loudly."""
    from harness import TINY
    from truestep.config import load_config
    from truestep.core.status import RankStatus
    from truestep.parallel.dist import DistContext
    from truestep.telemetry.run_logs import RunLogs
    from truestep.train.trainer import Trainer

    cfg = load_config("tiny", [f"--run.dir={tmp_path}", *TINY])
    trainer = Trainer(cfg, DistContext(), RunLogs(tmp_path, 0, enabled=False), RankStatus())
    with pytest.raises(RuntimeError, match="neither initialized nor loaded"):
        trainer.train_step(trainer.loader.next())
    trainer.initialize()
    assert math.isfinite(trainer.train_step(trainer.loader.next()).loss)
