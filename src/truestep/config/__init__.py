"""Typed job configuration: dataclasses, TOML loading, overrides, validation, fingerprint.

This package must not import torch.distributed: configs are checked before any process-group work.
"""

from truestep.config.errors import ConfigError
from truestep.config.load import load_config, to_dict, to_toml
from truestep.config.schema import (
    CheckpointConfig,
    DataConfig,
    JobConfig,
    MetricsConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    ResilienceConfig,
    RunConfig,
    ScheduleConfig,
    TrainConfig,
)
from truestep.config.validate import validate, validate_layout

__all__ = [
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "JobConfig",
    "MetricsConfig",
    "ResilienceConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainConfig",
    "load_config",
    "to_dict",
    "to_toml",
    "validate",
    "validate_layout",
]
