"""Every RNG stream a rank owns: seeding at a fresh start, and JSON-safe capture/restore for checkpoints.

Streams are per data-parallel rank: TP peers share a stream so dropout on replicated activations stays
identical across them. Policy on a layout change: streams are re-derived from (seed, dp_rank, step),
deterministically, because the old per-rank streams have no counterpart in the new layout.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch


def derive_seed(seed: int, dp_rank: int, step: int) -> int:
    return int(np.random.SeedSequence([seed, dp_rank, step]).generate_state(1, dtype=np.uint64)[0] >> 1)


def seed_streams(seed: int, dp_rank: int, step: int = 0) -> None:
    derived = derive_seed(seed, dp_rank, step)
    random.seed(derived)
    np.random.seed(derived % 2**32)
    torch.manual_seed(derived)  # also seeds every CUDA device


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def capture_rng() -> dict[str, Any]:
    """Python, NumPy, torch CPU and every CUDA device generator, as plain JSON types."""
    version, state, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "python": [version, list(state), gauss],
        "numpy": [np_kind, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": _b64(torch.get_rng_state()),
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def restore_rng(saved: dict[str, Any]) -> None:
    version, state, gauss = saved["python"]
    random.setstate((version, tuple(state), gauss))
    kind, keys, pos, has_gauss, cached = saved["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(saved["torch"]))
    if saved["cuda"]:
        if not torch.cuda.is_available() or torch.cuda.device_count() < len(saved["cuda"]):
            raise RuntimeError("checkpoint holds CUDA RNG states but this process has fewer CUDA devices")
        torch.cuda.set_rng_state_all([_unb64(s) for s in saved["cuda"]])
