"""What benchmarks/memory_recovery.py's numbers mean: its phases of a recovery from memory add up to the
MTTR and take the restore from the memory_restore event; the projection's arithmetic. On constructed
inputs (the benchmark itself is run by hand)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from memory_projection import project_table  # noqa: E402
from memory_recovery import PHASES, phases  # noqa: E402


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_memory_recovery_phases_add_up_to_the_mttr(tmp_path: Path) -> None:
    t0 = 1000.0
    sup = {"source": "supervisor"}
    _write(
        tmp_path / "events.jsonl",
        [
            {**sup, "time": t0 + 0.11, "event": "failure_detected", "detected_at": t0 + 0.1},
            {**sup, "time": t0 + 0.15, "event": "teardown_complete", "teardown_s": 0.04},
            {**sup, "time": t0 + 0.153, "event": "attempt_start", "attempt": 1},
            {
                "time": t0 + 0.22,
                "attempt": 1,
                "event": "rendezvous",
                "began": t0 + 0.16,
                "rendezvous_s": 0.05,
            },
            {"time": t0 + 0.5, "attempt": 1, "event": "memory_restore", "restore_s": 0.2, "step": 6}
            | {"source": "memory", "steps_lost": 1},
        ],
    )
    before = [{"attempt": 0, "step": s, "time": t0 - 1 + s / 10, "step_time": 0.03} for s in range(1, 8)]
    after = [{"attempt": 1, "step": s, "time": t0 + 0.55 + (s - 7) / 10, "step_time": 0.03} for s in (7, 8)]
    _write(tmp_path / "metrics.jsonl", before + after)
    got = phases(tmp_path, t0)
    assert sum(got[p] for p in PHASES) == pytest.approx(got["mttr"]) and got["mttr"] == pytest.approx(0.55)
    expected = {"detect": 0.1, "teardown": 0.05, "handoff": 0.01, "rendezvous": 0.05, "build": 0.09}
    assert {p: round(got[p], 6) for p in expected} == expected
    assert got["restore"] == pytest.approx(0.2) and got["first_step"] == pytest.approx(0.05)
    assert (got["source"], got["step"], got["steps_lost"]) == ("memory", 6, 1)
    assert got["regain"] == pytest.approx(0.55)  # step 7, the newest before the fault, done again


def test_the_projection_is_bytes_over_bandwidth_beside_the_papers_phases() -> None:
    table = project_table(
        host_gbps=10.0, net_gbps=10.0, sha_gbps=1.0, read_gbps_rank=1.0, read_gbps_total=1e9
    )
    row = next(line for line in table.splitlines() if line.startswith("| Llama 3.1 8B"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # 8e9 x 12 B over 64 ranks = 1.5 GB: capture 0.15 + 1.5 s, transfer 0.15 s, restore from memory
    # 0.15 + 1.5 + 0.15 s, from disk max(1.5 s read, 1.5 s hash); MTTR = 190 s + the restore
    assert cells[2:9] == ["1.50 GB", "1.65 s", "0.15 s", "1.80 s", "1.50 s", "191.80 s", "191.50 s"]
    assert cells[9] == "217-235 s"
