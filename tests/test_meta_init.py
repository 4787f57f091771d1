"""The training model is built on the meta device and each rank allocates only its shards, yet every
layout starts from exactly the weights an unsharded init from the same seed gives (bit patterns of the
gathered parameters), on the meta path and the full-model path alike, in both init schemes (blockwise:
each rank computes its own shard's tiles only; full: the scheme before round 3), and again after the
fresh-start re-init (`Trainer.initialize`). What it saves in memory: benchmarks/init_memory.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import gloo_ranks
from init_cases import SEED, differing, model_config

pytestmark = pytest.mark.multiprocess

# (world, tp, extra overrides): FSDP only, TP only, FSDP x TP (strided shards), tied embeddings under
# TP, an odd world (every dim uneven over 3 ranks), the full-model path, and the old "full" scheme.
CASES = {
    "fsdp2": (2, 1, []),
    "tp2": (2, 2, []),
    "fsdp2xtp2": (4, 2, []),
    "tied-fsdp2xtp2": (4, 2, ["--model.tie_embeddings=true"]),
    "fsdp3": (3, 1, []),
    "full-fsdp2xtp2": (4, 2, ["--parallel.meta_init=false"]),
    "scheme-full-fsdp2xtp2": (4, 2, ["--train.init_scheme=full"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_layout_starts_from_the_unsharded_init_bit_for_bit(case: str, tmp_path: Path) -> None:
    from init_cases import rank_worker

    world, tp, extra = CASES[case]
    out = tmp_path / "out"
    out.mkdir()
    gloo_ranks(rank_worker, (world, tp, str(tmp_path / "init"), extra, str(out)), world)
    seen = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    for rank, facts in enumerate(seen):
        assert facts["built"] == [], (rank, facts)
        assert facts["after_reset"] == [], (rank, facts)
    # Each rank holds a share of the parameters, not all of them.
    total = sum(p.numel() for p in _unsharded(extra).parameters())
    assert max(f["local_numel"] for f in seen) < total * 0.75, (seen, total)


def _unsharded(extra: list[str]):
    from truestep.model.llama import Transformer

    return Transformer(model_config(extra).model)


@pytest.mark.parametrize("scheme", ["blockwise", "full"])
def test_a_single_process_builds_the_same_model(scheme: str) -> None:
    from truestep.parallel.dist import DistContext
    from truestep.parallel.parallelize import build_model

    cfg = model_config([f"--train.seed={SEED}", f"--train.init_scheme={scheme}"])
    assert differing(build_model(DistContext(), cfg), cfg) == []
