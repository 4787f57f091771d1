"""The launch record (core/launch.py): one writer, one reader, and its path from the supervisor to a rank.

Everything here is in-process: the record's round trip through the environment, what torchrun and
SLURM environments read as, malformed values refused as one line (exit 2), the supervisor's records
for its ranks, and a warm standby adopting a handed record whole.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

import truestep
from truestep.core.errors import ExitCode
from truestep.core.launch import PER_ATTEMPT_ENV, Launch, LaunchError, without_launch
from truestep.supervisor.driver import rank_launch
from truestep.supervisor.handoff import adopted_env, become_rank, parked_env
from truestep.supervisor.restart_loop import LaunchSpec, node_launch

SRC = Path(truestep.__file__).parent

FULL = Launch(
    rank=5,
    world_size=8,
    local_rank=1,
    local_world_size=4,
    node=1,
    master_addr="node0",
    master_port=29500,
    attempt=3,
    job="job-7",
    generation="2",
    job_start=1700000000.123456,
    supervisor_pid=4242,
    run_dir="/runs/x",
    config_file="/runs/x/attempts/attempt00003-node1.toml",
    config_sha256="ab" * 32,
    faults="kill:rank=1:step=3",
    debug=True,
)


def test_the_record_round_trips_through_the_environment() -> None:
    assert Launch.from_env(FULL.to_env()) == FULL
    assert Launch.from_env(Launch().to_env()) == Launch()
    assert Launch.from_env({}) == Launch()  # no variables: a single unsupervised process
    assert FULL.to_env()["TRUESTEP_ATTEMPT"] == "3" and FULL.to_env()["GROUP_RANK"] == "1"
    assert "TRUESTEP_DEBUG" not in Launch().to_env()


def test_torchrun_and_slurm_environments_read_as_a_record() -> None:
    torchrun = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    launch = Launch.from_env({**torchrun, "MASTER_ADDR": "h", "MASTER_PORT": "29400"})
    assert (launch.rank, launch.world_size, launch.local_rank, launch.node) == (3, 4, 1, 1)
    assert (launch.master_addr, launch.master_port, launch.attempt, launch.supervised) == (
        "h",
        29400,
        None,
        False,
    )
    # The scheduler's identity of a requeued job, unless truestep's own is given.
    slurm = Launch.from_env({"SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "2"})
    assert (slurm.job, slurm.generation) == ("41", "2")
    ours = Launch.from_env({"SLURM_JOB_ID": "41", "TRUESTEP_JOB_ID": "j", "TRUESTEP_JOB_GENERATION": "5"})
    assert (ours.job, ours.generation) == ("j", "5")
    assert Launch.from_env({"RANK": "2"}).local_rank == 2  # torchrun-less default: local = global


def test_the_job_identity_is_decided_in_one_place() -> None:
    assert Launch(job="given").job_identity("fallback") == "given"
    assert Launch().job_identity("node0:29500") == "node0:29500"
    first, second = Launch().job_identity(), Launch().job_identity()
    assert first != second and str(os.getpid()) in first  # unique to this process and moment


@pytest.mark.parametrize(
    "env, says",
    [
        ({"RANK": "x"}, "RANK='x' is not an integer >= 0"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not an integer >= 1"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 is not a rank of a job of WORLD_SIZE=4"),
        ({"TRUESTEP_ATTEMPT": "-1"}, "TRUESTEP_ATTEMPT='-1' is not an integer >= 0"),
        ({"TRUESTEP_JOB_START": "soon"}, "TRUESTEP_JOB_START='soon' is not a number"),
        ({"TRUESTEP_SUPERVISOR_PID": "12"}, "TRUESTEP_SUPERVISOR_PID is set but TRUESTEP_JOB_ID is not"),
        ({"TRUESTEP_SUPERVISOR_PID": "0", "TRUESTEP_JOB_ID": "j"}, "TRUESTEP_SUPERVISOR_PID='0'"),
    ],
)
def test_a_malformed_record_is_a_usage_error_naming_the_variable(env: dict[str, str], says: str) -> None:
    with pytest.raises(LaunchError, match="^" + says.replace("(", r"\(")) as caught:
        Launch.from_env(env)
    assert caught.value.exit_code == ExitCode.USAGE


def test_a_supervised_rank_without_its_attempt_is_refused() -> None:
    parked = Launch.from_env({"TRUESTEP_SUPERVISOR_PID": "12", "TRUESTEP_JOB_ID": "j"})  # a parked standby
    assert parked.supervised
    with pytest.raises(LaunchError, match="TRUESTEP_ATTEMPT is not"):
        parked.supervised_attempt()
    assert Launch().supervised_attempt() is None
    assert FULL.supervised_attempt() == 3


def test_faults_from_the_environment_come_first_then_the_command_line() -> None:
    launch = Launch.from_env({"TRUESTEP_FAULTS": "a"})
    assert launch.with_faults(["b", "c"]).faults == "a;b;c"
    assert Launch().with_faults(["b"]).faults == "b"


def test_the_supervisor_writes_one_record_per_rank_slot_and_attempt(tmp_path: Path) -> None:
    own = Launch.from_env({"TRUESTEP_FAULTS": "kill:rank=3:step=2", "TRUESTEP_JOB_GENERATION": "4"})
    spec = LaunchSpec(nproc=2, nnodes=2, node_rank=1, master_addr="node0", job_id="job", launch=own)
    node = node_launch(spec, 123.5, tmp_path)
    records = [rank_launch(node, local, 7, 29500, tmp_path / "cfg.toml", "ab" * 32) for local in range(2)]
    assert [(r.rank, r.local_rank, r.node) for r in records] == [(2, 0, 1), (3, 1, 1)]
    for record in records:
        assert (record.world_size, record.local_world_size, record.attempt) == (4, 2, 7)
        assert (record.job, record.generation, record.faults) == ("job", "4", own.faults)
        assert (record.supervisor_pid, record.run_dir, record.job_start) == (
            os.getpid(),
            str(tmp_path),
            123.5,
        )
        assert Launch.from_env(record.to_env()) == record  # what the rank reads is what was written
    # Two attempts of one slot differ only in the per-attempt fields (what a warm standby may learn).
    later = rank_launch(node, 1, 8, 29501, tmp_path / "cfg2.toml", "cd" * 32)
    differ = {
        k
        for k in {**records[1].to_env(), **later.to_env()}
        if records[1].to_env().get(k) != later.to_env().get(k)
    }
    assert differ == set(PER_ATTEMPT_ENV)


def test_nothing_of_the_supervisors_own_record_leaks_into_a_ranks() -> None:
    stale = {
        "PATH": "/bin",
        "TRUESTEP_ATTEMPT": "9",
        "TRUESTEP_CONFIG_FILE": "/old",
        "RANK": "3",
        "TRUESTEP_DEBUG": "1",
    }
    assert without_launch(stale) == {"PATH": "/bin"}
    rank_env = {**without_launch(stale), **Launch(attempt=1, job="j", supervisor_pid=1).to_env()}
    assert Launch.from_env(rank_env) == Launch(attempt=1, job="j", supervisor_pid=1)


def test_a_forked_rank_adopts_the_record_it_is_handed_whole(tmp_path: Path) -> None:
    """What a process forked by the warm template does first (supervisor/handoff.py `become_rank`),
    in-process: its environment afterwards reads back as exactly the record the supervisor sent, and it
    becomes `truestep train` (no argv is handed over)."""
    base = {"PATH": os.environ.get("PATH", "/bin"), "OMP_NUM_THREADS": "1"}
    slot0 = Launch(
        rank=0, world_size=2, local_rank=0, local_world_size=2, attempt=0, job="j", supervisor_pid=1
    )
    handed = slot0.for_rank(
        rank=1,
        local_rank=1,
        attempt=1,
        master_port=2345,
        config_file=str(tmp_path / "attempt1.toml"),
        config_sha256="ef" * 32,
    )
    saved_env, saved_argv, saved_start = dict(os.environ), list(sys.argv), truestep.STARTED_AT
    try:
        parked = parked_env({**base, **slot0.to_env()})
        env = adopted_env({**base, **handed.to_env()}, parked, parked)
        argv = become_rank(handed, env, lambda: None, received=5.0, handoff={"sent_at": 4.0})
        assert argv == ["train"] and sys.argv[1:] == ["train"]
        assert Launch.from_env() == handed
        assert (truestep.STARTED_AT, truestep.HANDED_OVER_AT) == (5.0, 4.0)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:] = saved_argv
        truestep.STARTED_AT = saved_start
        truestep.HANDED_OVER_AT = None


def test_no_module_but_the_launch_record_reads_a_truestep_variable() -> None:
    """The Done-when grep as a test: outside core/launch.py no module reads os.environ / os.getenv with
    a TRUESTEP_* name (its constant from core/names.py or the literal)."""
    from truestep.core import names

    env_constants = {k for k, v in vars(names).items() if k.startswith("ENV_") and isinstance(v, str)}
    strays = []
    for path in SRC.rglob("*.py"):
        module = path.relative_to(SRC).as_posix()
        if module == "core/launch.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = ast.unparse(node.func)
            reads = func in ("os.environ.get", "os.getenv", "environ.get") or func.endswith(
                "environ.__getitem__"
            )
            if reads and node.args:
                arg = ast.unparse(node.args[0])
                if arg in env_constants or "TRUESTEP_" in arg:
                    strays.append(f"{module}:{node.lineno}: {func}({arg})")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                key = ast.unparse(node.slice)
                if (key in env_constants or "TRUESTEP_" in key) and isinstance(node.ctx, ast.Load):
                    strays.append(f"{module}:{node.lineno}: os.environ[{key}]")
    assert strays == []
