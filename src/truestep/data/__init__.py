"""Data pipeline: tokenize text into shards, view them as windows, and feed exact, resumable batches.

The global sample order is a pure function of (data_seed, global batch index), so the loader's
whole state is one integer and resuming is O(1) and independent of the data-parallel size.

The names below are imported on first use: `prepare-data` and its worker processes need no torch, and
the loader (which does) is not imported until asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "BatchLoader": "truestep.data.loader",
    "ByteTokenizer": "truestep.data.tokenizer",
    "DataError": "truestep.data.errors",
    "GlobalSampler": "truestep.data.sampler",
    "HFTokenizer": "truestep.data.tokenizer",
    "MixtureLoader": "truestep.data.mixture",
    "TokenDataset": "truestep.data.dataset",
    "build_loader": "truestep.data.build",
    "default_demo_dir": "truestep.data.demo",
    "demo_corpus_files": "truestep.data.demo",
    "dtype_for_vocab": "truestep.data.meta",
    "ensure_demo_data": "truestep.data.demo",
    "load_tokenizer": "truestep.data.tokenizer",
    "prepare_data": "truestep.data.shards",
    "read_meta": "truestep.data.meta",
    "verify_data_dir": "truestep.data.meta",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'truestep.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
