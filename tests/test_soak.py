"""The soak (benchmarks/soak.py): its fault plan, the quarantine retention rule it relies on, and a short
soak end to end -- one job under a fault of every class the supervisor survives, bitwise equal to the
failure-free reference, with nothing left behind. The full soak (>= 5,000 steps, >= 25 faults) is run by
hand; its numbers are in benchmarks/README.md."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import soak  # noqa: E402
import soak_plan  # noqa: E402

from truestep.checkpoint.catalog import quarantined_past  # noqa: E402
from truestep.faults.spec import parse_faults  # noqa: E402


def test_the_plan_is_seeded_covers_every_class_and_fits_the_job() -> None:
    planned = soak_plan.plan(7, 14, 1000, 50, world=2)
    assert planned == soak_plan.plan(7, 14, 1000, 50, world=2)
    assert planned != soak_plan.plan(8, 14, 1000, 50, world=2)
    assert [f.attempt for f in planned] == list(range(14))
    assert all(50 < f.step <= 900 for f in planned) and [f.step for f in planned] == sorted(
        f.step for f in planned
    )
    assert min(Counter(f.cls for f in planned).values()) >= 14 // len(soak_plan.CLASSES)
    assert set(Counter(f.cls for f in planned)) == set(soak_plan.CLASSES)
    assert planned[0].cls != "restore"  # attempt 0 starts fresh: nothing to restore
    for fault in planned:
        [spec] = parse_faults(fault.spec)  # every spec is one the ranks accept
        assert spec.restart == fault.attempt
        if spec.at in {f"save:{p}" for p in soak_plan.COMMIT_PHASES}:
            assert spec.rank == 0, fault  # only rank 0 commits
    with pytest.raises(ValueError, match="one per class"):
        soak_plan.plan(1, 3, 1000, 50, world=2)


def test_quarantine_retention_deletes_only_the_oldest_beyond_the_limit(tmp_path: Path) -> None:
    quarantine = tmp_path / "quarantine"
    names = [
        "step_00000010.1000.torn",
        "step_00000030.900.torn",
        "step_00000030.950.bad",
        "step_00000020.5.x",
    ]
    for name in names:
        (quarantine / name).mkdir(parents=True)
    (quarantine / "step_00000040.1.link").symlink_to(tmp_path)  # never a checkpoint: never listed
    assert quarantined_past(tmp_path, 0) == []  # 0 keeps all
    assert [p.name for p in quarantined_past(tmp_path, 2)] == ["step_00000020.5.x", "step_00000010.1000.torn"]
    assert [p.name for p in quarantined_past(tmp_path, 3)] == ["step_00000010.1000.torn"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_short_soak_is_bitwise_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Six faults, one of each class, on a 120-step job checkpointing every 10 steps: it must end bitwise
    equal to the reference, every class must have fired, and no process, listening port or shared-memory
    segment may outlive it; quarantine stays within its retention rule."""
    argv = ["--steps=120", "--interval=10", "--faults=6", "--min-faults=6", "--keep-quarantined=1"]
    parser_args = [*argv, "--sample-s=0.5", f"--out={tmp_path}"]
    summary = soak.run(*soak.parse(parser_args))
    assert summary["comparison"]["bitwise"], summary["comparison"]
    assert summary["soak"]["exit_codes"][-1] == 0 and 75 in summary["soak"]["exit_codes"], summary["soak"]
    assert set(summary["faults"]["by_class"]) == set(soak_plan.CLASSES), summary["faults"]
    assert summary["faults"]["fired"] == 6, summary["faults"]
    assert summary["leftovers"] == {"processes": [], "listening_ports": [], "shared_memory": []}
    [quarantine] = [b for b in summary["bounds"] if b["metric"] == "quarantine_entries"]
    assert quarantine["bounded"], quarantine
    assert (tmp_path / "soak.png").stat().st_size > 0
