"""docs/data.md's walkthrough runs as written: a FineWeb-style Parquet tree and a two-source mixture."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from corpora_cases import write_parquet
from harness import truestep_env

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Walkthrough: a FineWeb-style Parquet directory and a two-source mixture"


def walkthrough_commands() -> str:
    text = (ROOT / "docs" / "data.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the walkthrough has one bash block"
    return blocks[0]


def make_corpus(cwd: Path) -> None:
    import zstandard

    tree = cwd / "fineweb" / "sample" / "10BT"
    tree.mkdir(parents=True)
    for part in range(3):
        docs = [f"Page {part}-{i}: a web document about the weather, {i % 7} sunny days." for i in range(120)]
        write_parquet(tree / f"00{part}_00000.parquet", docs)
    (cwd / "stack").mkdir()
    for part in range(2):
        lines = [
            json.dumps({"content": f"def f{part}_{i}(x):\n    return x + {i}\n", "lang": "py"})
            for i in range(150)
        ]
        (cwd / "stack" / f"part-{part}.jsonl.zst").write_bytes(
            zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode())
        )


def test_walkthrough_runs_as_written(tmp_path: Path) -> None:
    make_corpus(tmp_path)
    env = truestep_env({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", walkthrough_commands()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    web = json.loads((tmp_path / "data" / "web" / "meta.json").read_text())
    code = json.loads((tmp_path / "data" / "code" / "meta.json").read_text())
    assert web["documents"] == 360 and code["documents"] == 300
    last = json.loads(proc.stdout.strip().splitlines()[-1])  # the `tail -n 1` of metrics.jsonl
    assert last["step"] == 12
    assert set(last["tokens_per_source"]) == {"data/web", "data/code"}
    assert last["tokens_per_source"]["data/web"] > last["tokens_per_source"]["data/code"]

    # Export finds a mixture's tokenizer through its first source (not the demo corpus an empty data.path
    # would mean).
    from truestep.interop.tokenizer_export import checkpoint_tokenizer

    ckpt = sorted((tmp_path / "runs" / "mix" / "checkpoints").glob("step_*"))[-1]
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        found = checkpoint_tokenizer(ckpt)
    finally:
        os.chdir(cwd)
    assert found.kind == "byte" and "data directory data/web" in found.source, found
