"""A gloo rank (torch.multiprocessing.spawn) that builds the training model as the trainer does and
writes what it got: whether every parameter, gathered whole, equals an unsharded init from the same seed
bit for bit, before and after the fresh-start re-init, in the configured `train.init_scheme`. Used by
tests/test_meta_init.py."""

from __future__ import annotations

import json
from pathlib import Path

import torch

SEED = 11


def model_config(overrides: list[str]):
    from truestep.config import load_config

    # vocab 510 (255 rows per TP rank) and dim 120 shard unevenly over the dp ranks: FSDP2 pads, DTensor chunks; both must agree.
    return load_config("tiny", ["--model.vocab_size=510", "--model.dim=120", "--model.n_heads=4", *overrides])


def differing(model: torch.nn.Module, cfg) -> list[str]:
    """Names whose gathered full value differs (bitwise) from an unsharded init. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from truestep.model.llama import Transformer

    reference = Transformer(cfg.model)
    reference.init_weights(SEED, cfg.train.init_scheme)
    expected = reference.state_dict()
    got = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    names = sorted(set(expected) | set(got))
    return [n for n in names if n not in got or n not in expected or not _same_bits(got[n], expected[n])]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def rank_worker(rank: int, world: int, tp: int, init_file: str, overrides: list[str], out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from truestep.parallel.dist import DistContext
    from truestep.parallel.parallelize import build_model, init_parameters

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        cfg = model_config([f"--train.seed={SEED}", f"--parallel.tp={tp}", *overrides])
        dp = world // tp
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        ctx = DistContext(
            rank=rank,
            world_size=world,
            dp=dp,
            tp=tp,
            dp_rank=mesh["dp"].get_local_rank(),
            tp_rank=mesh["tp"].get_local_rank(),
            backend="gloo",
            mesh=mesh,
        )
        model = build_model(ctx, cfg)
        built = differing(model, cfg)
        local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
        local_numel = sum(t.numel() for t in local)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # what a failed load could leave behind
        init_parameters(model, SEED, cfg.train.init_scheme)
        after_reset = differing(model, cfg)
        facts = {"built": built, "after_reset": after_reset, "local_numel": local_numel}
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(facts))
        # As truestep's own exit does (parallel.dist.leave): a rank that tears its group down while a
        # peer still finishes the last gather can abort that peer in gloo (CI: SIGABRT, "terminate
        # called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()
