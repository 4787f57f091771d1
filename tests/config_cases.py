"""Shared helpers for the config tests (test_config_load.py, test_config_validate.py)."""

from __future__ import annotations

from pathlib import Path

PRESETS = ["tiny", "small", "llama3-8b", "13b", "70b", "llama3.2-1b", "llama3.1-8b"]


def _write(tmp_path: Path, text: str, name: str = "job.toml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)
