"""Mixtures: several prepared directories drawn in proportion to their weights, in a global order.

Every global batch is G consecutive picks of a smooth weighted round robin over integer quotas (the
weights as small fractions): each pick adds every source's quota to its credit, takes the source with
the most credit (the lowest index on a tie) and charges it the sum of the quotas. Source s's k-th pick
is sample `perm_s[k]` of its own seeded epoch order (`GlobalSampler` stream s; source 0 is drawn in
exactly the order `data.path` would give it). So the whole state is, per source, how many samples were
drawn and its credit, plus the batch cursor; every rank computes all G picks and keeps its contiguous
slice, so the order of global batches does not depend on the data-parallel size.

After n picks, source s has been drawn within one sample of n * w_s per period of the quotas' sum, so a
prefix of any length holds each source's share to within (number of sources) samples.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from truestep.data.dataset import TokenDataset
from truestep.data.errors import DataError
from truestep.data.loader import MicroBatch, check_batch_split, split_micro_batches
from truestep.data.sampler import GlobalSampler
from truestep.data.tokenizer_files import TOKENIZER_JSON

WEIGHT_DENOMINATOR = 1000
"""Weights are taken as fractions with denominators up to this: exact for three decimals."""


def quotas(weights: list[float]) -> list[int]:
    """Integer quotas in the ratio of `weights` (each weight as a fraction, smallest common scale)."""
    if not weights or any(not math.isfinite(w) or w <= 0 for w in weights):
        raise DataError(f"mixture weights must be positive finite numbers, got {weights}")
    total = sum(Fraction(w) for w in weights)
    shares = [
        (Fraction(w) / total).limit_denominator(WEIGHT_DENOMINATOR) or Fraction(1, 10**9) for w in weights
    ]
    scale = math.lcm(*(share.denominator for share in shares))
    ints = [int(share * scale) for share in shares]
    common = math.gcd(*ints)
    return [q // common for q in ints]


class Interleave:
    """Smooth weighted round robin: which source each global sample position draws from."""

    def __init__(self, quota: list[int]) -> None:
        self.quota = list(quota)
        self.total = sum(self.quota)
        self.credit = [0] * len(self.quota)
        self.drawn = [0] * len(self.quota)

    def take(self, count: int) -> np.ndarray:
        """Source ids of the next `count` positions; advances `credit` and `drawn`."""
        out = np.empty(count, dtype=np.int64)
        credit, quota, total, drawn = self.credit, self.quota, self.total, self.drawn
        sources = range(len(quota))
        for position in range(count):
            for s in sources:
                credit[s] += quota[s]
            best = max(sources, key=credit.__getitem__)  # max() keeps the first of equal keys
            credit[best] -= total
            drawn[best] += 1
            out[position] = best
        return out


@dataclass
class Source:
    """One source of a mixture: its directory, weight, windows and its own sample order."""

    path: str
    weight: float
    dataset: TokenDataset
    sampler: GlobalSampler

    @property
    def content(self) -> str:
        """A short id of the directory's tokens (its shard hashes): re-prepared data gets another."""
        hashes = [entry["sha256"] for entry in self.dataset.meta["shards"]]
        return hashlib.sha256(json.dumps(hashes).encode()).hexdigest()[:16]


def _tokenizer_id(dataset: TokenDataset) -> tuple[Any, ...]:
    meta = dataset.meta
    copy = dataset.data_dir / TOKENIZER_JSON
    digest = hashlib.sha256(copy.read_bytes()).hexdigest() if meta.get("tokenizer") != "byte" else "byte"
    return (meta["vocab_size"], meta["eos_id"], meta.get("bos_id"), digest)


class MixtureLoader:
    """Rank `dp_rank`'s micro-batches of each global batch of a weighted mixture (module docstring)."""

    def __init__(
        self,
        sources: list[tuple[str, float, Path]],
        seq_len: int,
        global_batch_size: int,
        data_seed: int,
        dp_rank: int,
        dp_size: int,
        micro_batch_size: int,
        allow_change: bool = False,
    ) -> None:
        """`sources`: (path as configured, weight, directory). `allow_change`: a saved state of other
        sources or weights is adopted (checkpoint.allow_config_change) instead of refused."""
        if not sources:
            raise DataError("a mixture needs at least one source")
        per_rank = check_batch_split(global_batch_size, dp_rank, dp_size, micro_batch_size)
        self.sources = [
            Source(
                path, weight, ds := TokenDataset(directory, seq_len), GlobalSampler(len(ds), 1, data_seed, s)
            )
            for s, (path, weight, directory) in enumerate(sources)
        ]
        first = self.sources[0]
        for other in self.sources[1:]:
            if _tokenizer_id(other.dataset) != _tokenizer_id(first.dataset):
                raise DataError(
                    f"data.sources {first.path} and {other.path} were prepared with different tokenizers "
                    "(vocabulary, special ids or tokenizer.json differ); prepare them with the same one"
                )
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.data_seed = data_seed
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.micro_batch_size = micro_batch_size
        self.num_micro_batches = per_rank // micro_batch_size
        self.allow_change = allow_change
        self.interleave = Interleave(quotas([s.weight for s in self.sources]))
        self.next_batch = 0

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the tokenizer that prepared the sources (the same for all)."""
        return self.sources[0].dataset.vocab_size

    @property
    def loss_masked(self) -> bool:
        """Whether any source is chat data: then every target is masked as its source says (a source
        without a mask trains every token)."""
        return any(s.dataset.has_mask for s in self.sources)

    def tokens_per_source(self) -> dict[str, int]:
        """Training tokens drawn from each source so far (samples x seq_len), by configured path."""
        return {
            s.path: drawn * self.seq_len for s, drawn in zip(self.sources, self.interleave.drawn, strict=True)
        }

    def global_picks(self) -> tuple[np.ndarray, np.ndarray]:
        """(source, sample index) of every position of global batch `next_batch`; advances the state."""
        before = list(self.interleave.drawn)
        picks = self.interleave.take(self.global_batch_size)
        samples = np.empty(self.global_batch_size, dtype=np.int64)
        for s, source in enumerate(self.sources):
            mask = picks == s
            samples[mask] = source.sampler.positions(before[s], int(mask.sum()))
        self.next_batch += 1
        return picks, samples

    def next(self) -> list[MicroBatch]:
        """This rank's micro-batches of global batch `next_batch`, then advance to the next batch."""
        picks, samples = self.global_picks()
        k = self.global_batch_size // self.dp_size
        mine = slice(self.dp_rank * k, (self.dp_rank + 1) * k)
        tokens = np.empty((k, self.seq_len + 1), dtype=np.int64)
        masks = np.empty((k, self.seq_len + 1), dtype=np.int64) if self.loss_masked else None
        for row, (s, i) in enumerate(zip(picks[mine], samples[mine], strict=True)):
            tokens[row] = self.sources[int(s)].dataset.sample(int(i))
            if masks is not None:
                masks[row] = self.sources[int(s)].dataset.sample_mask(int(i))
        return split_micro_batches(tokens, self.micro_batch_size, masks)

    # -- checkpoint state -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The cursor, and per source: identity, samples drawn and credit (a few integers each)."""
        return {
            "next_batch": self.next_batch,
            "data_seed": self.data_seed,
            "global_batch_size": self.global_batch_size,
            "sources": [
                {
                    "path": s.path,
                    "weight": s.weight,
                    "num_samples": len(s.dataset),
                    "content": s.content,
                    "drawn": drawn,
                    "credit": credit,
                }
                for s, drawn, credit in zip(
                    self.sources, self.interleave.drawn, self.interleave.credit, strict=True
                )
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved cursor bitwise; a state of other sources is refused unless allow_change."""
        saved = _parse_state(state)
        for key in ("data_seed", "global_batch_size"):
            if saved[key] != getattr(self, key):
                raise DataError(
                    f"data loader state mismatch: checkpoint has {key}={saved[key]}, "
                    f"but the current run has {key}={getattr(self, key)}"
                )
        current = self.state_dict()["sources"]
        same = [{k: v for k, v in e.items() if k not in ("drawn", "credit")} for e in saved["sources"]] == [
            {k: v for k, v in e.items() if k not in ("drawn", "credit")} for e in current
        ]
        if same:
            self.interleave.drawn = [e["drawn"] for e in saved["sources"]]
            self.interleave.credit = [e["credit"] for e in saved["sources"]]
        else:
            changes = _describe_changes(saved["sources"], current)
            if not self.allow_change:
                raise DataError(
                    "refusing to resume: the data mixture differs from the checkpoint's: "
                    + "; ".join(changes)
                    + ". Restore it, or pass --checkpoint.allow_config_change=true to continue with this one"
                )
            # Adopted: a source kept (same path and tokens) continues where it was; the interleaving
            # restarts from zero credit with the new weights.
            by_path = {e["path"]: e for e in saved["sources"]}
            for s, entry in enumerate(current):
                old = by_path.get(entry["path"])
                keep = old is not None and (old["num_samples"], old["content"]) == (
                    entry["num_samples"],
                    entry["content"],
                )
                self.interleave.drawn[s] = old["drawn"] if keep and old else 0
                self.interleave.credit[s] = 0
        self.next_batch = saved["next_batch"]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_state(state: Any) -> dict[str, Any]:
    """A saved mixture state, checked for shape and types (a rank-state file is untrusted input)."""
    if not isinstance(state, dict):
        raise DataError(f"data loader state must be a dict, got {type(state).__name__}")
    if "sources" not in state:
        raise DataError(
            "the checkpoint's data position is of a single corpus (data.path), but this run reads a "
            "mixture (data.sources)"
        )
    for key in ("next_batch", "data_seed", "global_batch_size"):
        if not _is_count(state.get(key)):
            raise DataError(
                f"data loader state: {key} must be a non-negative integer, got {state.get(key)!r}"
            )
    sources = state["sources"]
    if not isinstance(sources, list) or not sources:
        raise DataError("data loader state: sources must be a non-empty list")
    for index, entry in enumerate(sources):
        where = f"data loader state: sources[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise DataError(f"{where} must be an object with a path")
        if not all(_is_count(entry.get(k)) for k in ("num_samples", "drawn")):
            raise DataError(f"{where}: num_samples and drawn must be non-negative integers")
        credit = entry.get("credit")
        if not isinstance(credit, int) or isinstance(credit, bool):
            raise DataError(f"{where}: credit must be an integer, got {credit!r}")
    return state


def _describe_changes(saved: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[str]:
    """What differs between two mixtures, source by source, in words."""
    changes = []
    old = {e["path"]: e for e in saved}
    new = {e["path"]: e for e in current}
    for path in old.keys() - new.keys():
        changes.append(f"source {path} removed")
    for path in new.keys() - old.keys():
        changes.append(f"source {path} added")
    for path in old.keys() & new.keys():
        for key, label in (
            ("weight", "weight"),
            ("num_samples", "samples"),
            ("content", "tokens (re-prepared)"),
        ):
            if old[path].get(key) != new[path][key]:
                changes.append(f"source {path} {label}: {old[path].get(key)} -> {new[path][key]}")
    if not changes:
        changes.append(f"source order {[e['path'] for e in saved]} -> {[e['path'] for e in current]}")
    return sorted(changes)
