"""The initial weights of a Transformer, as a function of (seed, parameter name, position) alone.

Two schemes (`train.init_scheme`):

- **blockwise** (default): a parameter is cut into fixed tiles of its global value (`TILE_ROWS` rows x
  `TILE_COLS` columns, the last ones clipped at the edge); each tile is drawn whole from a generator
  seeded from (run seed, parameter name, tile row, tile column). Any rectangle of the parameter -- a
  rank's shard in any FSDP x TP layout, uneven or strided -- is computed from the tiles it touches
  alone, and is bit for bit that part of the unsharded value: a rank's init costs O(its shard), not
  O(model). A tile is always drawn with the same call whatever part of it is kept, because
  `torch.randn` of n values is not a prefix of `torch.randn` of n + 1 (it fills in vector chunks).
- **full**: one CPU generator seeded from the run seed draws every parameter's full value in
  `named_parameters` order (truestep's only scheme before round 3; kept so that runs started with it
  can be reproduced). Every rank draws every value: O(model) per rank.

Norm weights are ones in both; output projections (attention.wo, feed_forward.w2) use
init_std / sqrt(2 * n_layers), every other weight init_std.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from truestep.config.schema import ModelConfig

INIT_SCHEMES = ("blockwise", "full")
TILE_ROWS = 16
"""Rows of one tile. Part of the scheme: changing it changes every blockwise-initialized model."""
TILE_COLS = 1024
"""Columns of one tile (16 x 1024 values: ~0.2 ms to draw, so the per-tile seeding is a few %)."""


class _NoInitOnMeta(TorchFunctionMode):
    """Skips the in-place random and constant fills that module constructors run (nn.Linear's
    kaiming_uniform_, nn.Embedding's normal_) when their tensor is on the meta device: there they change
    nothing, yet the first one imports torch's Python decompositions (~0.5 s idle, seconds on a busy
    machine), a constant in every Trainer build that a resume would pay for values it never uses."""

    SKIPPED = frozenset(
        {"normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "trunc_normal_", "fill_", "zero_"}
    )
    """In-place fills, as tensor methods and as `torch.nn.init` functions (which dispatch here too)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        first = args[0] if args else kwargs.get("tensor")  # nn.init passes it by keyword
        if (
            getattr(func, "__name__", "") in self.SKIPPED
            and isinstance(first, torch.Tensor)
            and first.is_meta
        ):
            return first
        return func(*args, **kwargs)


@contextmanager
def on_meta() -> Iterator[None]:
    """Build modules on the meta device (shapes only, no storage) without running their initializers."""
    with torch.device("meta"), _NoInitOnMeta():
        yield


def param_std(name: str, cfg: ModelConfig) -> float | None:
    """The normal init's standard deviation for parameter `name`; None for a weight initialized to ones."""
    if name.endswith("norm.weight"):
        return None
    if name.endswith("attention.wo.weight") or name.endswith("feed_forward.w2.weight"):
        return cfg.init_std / math.sqrt(2 * cfg.n_layers)
    return cfg.init_std


def tile_seed(seed: int, name: str, tile_row: int, tile_col: int) -> int:
    """A 63-bit generator seed for one tile, from the run seed, the parameter's name and the tile's place."""
    key = f"truestep-init/{seed}/{name}/{tile_row}/{tile_col}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def _as_2d(shape: Sequence[int]) -> tuple[int, int]:
    if len(shape) == 2:
        return int(shape[0]), int(shape[1])
    if len(shape) == 1:
        return 1, int(shape[0])
    raise ValueError(f"blockwise init knows 1-D and 2-D parameters, not shape {tuple(shape)}")


def fill_blockwise(
    dest: torch.Tensor,
    seed: int,
    name: str,
    shape: Sequence[int],
    std: float | None,
    offset: Sequence[int],
) -> None:
    """Write into `dest` (any device, in place) the initial values of the rectangle of parameter `name`
    (global `shape`) that starts at `offset` and has `dest`'s shape, drawn from the tiles it touches only
    (module docstring). Each tile is drawn whole on the CPU into one reused buffer by one reused generator
    (reseeding it is drawing from a fresh one: the bits are those of `torch.randn(tile, generator)`), and
    its part inside the rectangle copied to `dest`; the scale is applied once, in place, at the end."""
    if std is None:
        dest.fill_(1.0)
        return
    rows, cols = _as_2d(shape)
    view = dest.view(1, -1) if len(shape) == 1 else dest
    r0, c0 = (0, int(offset[0])) if len(shape) == 1 else (int(offset[0]), int(offset[1]))
    nr, nc = view.shape
    if nr == 0 or nc == 0:
        return
    gen = torch.Generator(device="cpu")
    buffer = torch.empty(TILE_ROWS * TILE_COLS, dtype=torch.float32)
    for tr in range(r0 // TILE_ROWS, (r0 + nr - 1) // TILE_ROWS + 1):
        t_r0 = tr * TILE_ROWS
        t_rows = min(TILE_ROWS, rows - t_r0)
        a, b = max(r0, t_r0), min(r0 + nr, t_r0 + t_rows)
        for tc in range(c0 // TILE_COLS, (c0 + nc - 1) // TILE_COLS + 1):
            t_c0 = tc * TILE_COLS
            t_cols = min(TILE_COLS, cols - t_c0)
            c, d = max(c0, t_c0), min(c0 + nc, t_c0 + t_cols)
            tile = buffer[: t_rows * t_cols].view(t_rows, t_cols)
            tile.normal_(generator=gen.manual_seed(tile_seed(seed, name, tr, tc)))
            view[a - r0 : b - r0, c - c0 : d - c0].copy_(tile[a - t_r0 : b - t_r0, c - t_c0 : d - t_c0])
    dest.mul_(std)


def blockwise_region(
    seed: int,
    name: str,
    shape: Sequence[int],
    std: float | None,
    offset: Sequence[int],
    size: Sequence[int],
) -> torch.Tensor:
    """The initial values (fp32, CPU) of the rectangle `offset`..`offset + size` of parameter `name`
    whose global shape is `shape` (`fill_blockwise` into a new tensor)."""
    out = torch.empty(tuple(size), dtype=torch.float32)
    fill_blockwise(out, seed, name, shape, std, offset)
    return out
