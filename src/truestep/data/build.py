"""`build_loader`: the one call the trainer makes to get its data loader from the config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from truestep.data.dataset import TokenDataset
from truestep.data.demo import ensure_demo_data
from truestep.data.loader import BatchLoader
from truestep.data.sampler import GlobalSampler

if TYPE_CHECKING:  # only for annotations; keeps data importable without pulling in the config package
    from truestep.config.schema import DataConfig


def build_loader(
    cfg_data: DataConfig,
    global_batch_size: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
) -> BatchLoader:
    """Open the configured data (the demo corpus when `cfg_data.path` is empty) for rank `dp_rank`,
    feeding micro-batches of `micro_batch_size` samples (the effective value: `TrainConfig.micro_batch`)."""
    data_dir = Path(cfg_data.path).expanduser() if cfg_data.path else ensure_demo_data()
    dataset = TokenDataset(data_dir, cfg_data.seq_len)
    sampler = GlobalSampler(len(dataset), global_batch_size, cfg_data.data_seed)
    return BatchLoader(dataset, sampler, dp_rank, dp_size, micro_batch_size)
