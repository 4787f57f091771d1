"""Words an operator reads (issue 40): what the console, the job logs and `truestep ckpt` say must say
what happened and why, in one line each, never a raw PyTorch traceback."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch


def test_a_missing_dcp_metadata_is_one_line_not_a_torch_traceback(tmp_path: Path, caplog) -> None:
    """DCP's loader logs a missing `.metadata` with exc_info to the root logger (the traceback that filled
    the demo's atomic-commit ablation logs); truestep keeps the line and the error, not the traceback."""
    import torch.distributed.checkpoint as dcp

    from truestep.checkpoint.safe_dcp import SafeFileSystemReader, single_process

    with caplog.at_level(logging.WARNING), single_process(), pytest.raises(BaseException, match="metadata"):
        dcp.load({"w": torch.zeros(2)}, storage_reader=SafeFileSystemReader(tmp_path))
    [record] = [r for r in caplog.records if "metadata is not found" in r.getMessage()]
    text = logging.Formatter().format(record)
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert "FileNotFoundError" in text and ".metadata" in text
