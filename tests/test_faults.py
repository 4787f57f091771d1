"""Fault specs: parsing, validation, campaigns, and the inert default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from truestep.faults import hooks
from truestep.faults.spec import FaultSpec, campaign, parse_fault, parse_faults


def test_faults_that_meet_a_recovery_have_their_points() -> None:
    """The points where a second fault meets the recovery from a first (tests/test_faults_meet.py)."""
    assert parse_fault("kill:at=rendezvous:rank=1:restart=1") == FaultSpec(
        "kill", "rendezvous", rank=1, restart=1
    )
    assert parse_fault("kill:at=handoff:rank=0:restart=1") == FaultSpec("kill", "handoff", rank=0, restart=1)
    assert parse_fault("term:at=teardown") == FaultSpec("term", "teardown", rank=0)
    assert parse_fault("term:rank=1:to=rank:from=30").to_rank
    assert not parse_fault("term:step=3").to_rank and not parse_fault("term:to=job:step=3").to_rank
    for bad in ("kill:to=rank:step=3", "term:to=node:step=3"):
        with pytest.raises(ValueError, match="to=job|rank"):
            parse_fault(bad)


def test_user_facing_kinds_map_to_fault_points() -> None:
    assert parse_fault("kill:rank=1:step=120") == FaultSpec("kill", "train:step", step=120, rank=1)
    assert parse_fault("term:step=300") == FaultSpec("term", "train:step", step=300, rank=0)
    assert parse_fault("hang:rank=0:step=50:restart=2") == FaultSpec(
        "hang", "train:step", step=50, rank=0, restart=2
    )
    assert parse_fault("crash-in-save:phase=after-shards") == FaultSpec("crash", "save:after-shards")
    assert parse_fault("corrupt:target=latest:step=9").kind == "corrupt"
    assert parse_fault("nan:step=80") == FaultSpec("nan", "train:loss", step=80)
    assert parse_fault("slow:rank=1:factor=3") == FaultSpec("slow", "train:step", rank=1, factor=3.0)
    assert parse_fault("kill:rank=1:time=30").time == 30.0
    assert parse_fault("kill:node=1:step=12") == FaultSpec("kill", "train:step", step=12, node=1)
    assert parse_fault("crash-in-save:phase=mid-shards:from=13").from_step == 13
    assert parse_fault("sleep:at=save:before-marker:seconds=2") == FaultSpec(
        "sleep", "save:before-marker", seconds=2.0
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("explode:step=3", "unknown kind"),
        ("kill:rank=1", "needs step=N, from=N or time=SECONDS"),
        ("crash-in-save:phase=sideways", "phase must be one of"),
        ("slow:rank=1:factor=1", "factor > 1"),
        ("kill:step=3:colour=red", "unknown fields"),
        ("corrupt:target=oldest:step=3", "target=latest"),
        ("crash:step=3", "needs at=<point>"),
        ("kill:node=1:rank=0:step=3", "node=K is for kill:node=K:step=N"),
        ("hang:node=1:step=3", "node=K is for kill:node=K:step=N"),
    ],
)
def test_bad_specs_are_rejected_with_a_reason(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fault(spec)


def test_campaign_is_deterministic_and_one_fault_per_attempt() -> None:
    first = campaign(5, seed=7, max_steps=100, world_size=2, interval=10)
    assert first == campaign(5, seed=7, max_steps=100, world_size=2, interval=10)
    assert first != campaign(5, seed=8, max_steps=100, world_size=2, interval=10)
    specs = parse_faults(";".join(first))
    assert [s.restart for s in specs] == [0, 1, 2, 3, 4]
    assert all(s.kind in ("kill", "hang", "term", "crash") for s in specs)
    assert all(s.step is not None and 1 <= s.step < 100 for s in specs)


def test_fault_fires_once_only_on_its_rank_and_attempt_and_is_logged(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TRUESTEP_RESTART_COUNT", "0")
    hooks.set_context(run_dir=tmp_path)
    hooks.arm(parse_faults("nan:step=4:rank=1;nan:step=5:rank=0;nan:step=6:restart=1"))
    try:
        assert [hooks.poison_loss(s) for s in range(1, 8)] == [False, False, False, True, False, False, False]
        assert not hooks.poison_loss(4)  # fired once; a replayed step 4 runs clean
        logged = (tmp_path / "events.jsonl").read_text()
        assert logged.count('"fault_injected"') == 1 and '"step": 4' in logged
    finally:
        hooks.arm([])
        hooks._CONTEXT.clear()


def test_nothing_armed_by_default() -> None:
    assert "TRUESTEP_FAULTS" not in os.environ or not os.environ["TRUESTEP_FAULTS"]
    assert hooks.armed() == []
    hooks.fault_point("save:before-marker", step=1)  # inert: returns without effect


@pytest.mark.multiprocess
def test_a_node_fault_must_name_a_node_of_the_job(tmp_path: Path) -> None:
    """kill:node=K on a job without node K could never fire: refused before anything starts."""
    cmd = [sys.executable, "-m", "truestep", "launch", "tiny", "--fault=kill:node=1:step=3"]
    proc = subprocess.run(
        [*cmd, f"--run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "node 1 is not one of this job's 1 nodes" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()
