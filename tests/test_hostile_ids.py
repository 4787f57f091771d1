"""A job id is outside input (--job-id, TRUESTEP_JOB_ID, SLURM_JOB_ID) stored in bounded places: the lease
(a control file of at most 64 KiB), the node link's hello (4 KiB), every event. A 100 KB id once made a
supervisor refuse its own lease (exit 4); now an id or launch generation longer than ID_LIMIT, or not
printable, is kept as its head and a SHA-256 (core/launch.py `bounded_id`): the same on every node,
distinct for distinct ids, and the job keeps its lease."""

from __future__ import annotations

from pathlib import Path

import pytest

from truestep.core.launch import ID_LIMIT, Launch, bounded_id
from truestep.core.names import ENV_JOB_GENERATION, ENV_JOB_ID
from truestep.resilience.lease import RunDirLease, check_fence, read_lease
from truestep.supervisor.link_auth import hello_line, new_key
from truestep.supervisor.link_gate import HELLO_LIMIT

HUGE = "j" * 100_000


def test_a_100_kb_job_id_keeps_its_lease(tmp_path: Path) -> None:
    launch = Launch.from_env({ENV_JOB_ID: HUGE, ENV_JOB_GENERATION: "g" * 100_000})
    assert len(launch.job) <= ID_LIMIT and len(launch.generation) <= ID_LIMIT
    lease = RunDirLease(tmp_path, launch.job, ttl_s=30.0, generation=launch.generation)
    lease.acquire()
    holder = read_lease(tmp_path)  # a lease.json over 64 KiB would be refused here, as not a lease
    assert holder is not None and holder.job == launch.job
    lease.begin_attempt()
    check_fence(tmp_path, launch.job, 0, generation=launch.generation)  # still this job's
    lease.release()
    hello = {"type": "hello", "node": 1, "nnodes": 2, "job": launch.job, "generation": launch.generation,
             "host": "h", "nonce": "0" * 32}  # fmt: skip
    assert len(hello_line(new_key(), "0" * 32, hello)) < HELLO_LIMIT  # the node link can carry it


@pytest.mark.parametrize("text", [HUGE, "a\nb", "x" * (ID_LIMIT + 1), "\x00" * 10])
def test_a_bounded_id_is_stable_distinct_and_maps_to_itself(text: str) -> None:
    key = bounded_id(text)
    assert len(key) <= ID_LIMIT and key.isprintable()
    assert bounded_id(key) == key == bounded_id(text)  # every node, and a rank reading it back, agree
    assert bounded_id(text + "!") != key


@pytest.mark.parametrize("text", ["4242", "hostile-link", "node0:29500", "x" * ID_LIMIT])
def test_an_ordinary_id_is_kept_as_it_is(text: str) -> None:
    assert bounded_id(text) == text
    assert Launch.from_env({ENV_JOB_ID: text}).job == text
