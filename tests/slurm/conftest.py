"""A real one-node SLURM cluster for the tests in this directory (scripts/slurm/local_cluster.sh).

The session fixture brings the cluster up under a fresh prefix (installing the Debian packages if they
are missing) and tears it down afterwards, so plain `pytest` suffices. The tests skip, with the reason,
only when this machine cannot run SLURM (not root, no apt-get, package install failed: the script exits
3) or when TRUESTEP_SLURM=0; any other bring-up failure is an error that shows the daemons' logs.
Set TRUESTEP_SLURM_KEEP=1 to keep the prefix (config, state, logs) after the session; it is also kept
when a test failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from multinode import Reference
from slurmtools import EXIT_UNSUPPORTED, LOCAL_CLUSTER, NETNS_CLUSTER, UP_TIMEOUT_S, Cluster, NetnsCluster


def _bring_up(prefix: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(LOCAL_CLUSTER), "up", str(prefix)],
        env=env,
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_S,
    )


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if os.environ.get("TRUESTEP_SLURM") == "0":
        pytest.skip("SLURM tests disabled by TRUESTEP_SLURM=0")
    if sys.platform != "linux":
        pytest.skip(f"SLURM tests need Linux (this is {sys.platform})")
    # Not under pytest's basetemp: that is mode 0700, and munged (running as user munge) must reach its
    # socket directory under the prefix.
    prefix = Path(tempfile.mkdtemp(prefix="truestep-slurm-"))
    prefix.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env["SLURM_CONF"] = str(prefix / "etc" / "slurm.conf")
    started = time.monotonic()
    try:
        proc = _bring_up(prefix, env)
    except subprocess.TimeoutExpired:
        subprocess.run(["bash", str(LOCAL_CLUSTER), "down", str(prefix)], env=env, timeout=120, check=False)
        pytest.fail(f"local SLURM cluster did not come up within {UP_TIMEOUT_S} s (prefix {prefix})")
    if proc.returncode == EXIT_UNSUPPORTED:
        reason = "cannot run SLURM on this machine: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"\n[tests/slurm] SKIPPING: {reason}\n{proc.stderr}", file=sys.stderr)
        shutil.rmtree(prefix, ignore_errors=True)
        pytest.skip(reason)
    if proc.returncode != 0:
        subprocess.run(["bash", str(LOCAL_CLUSTER), "down", str(prefix)], env=env, timeout=120, check=False)
        pytest.fail(
            f"local SLURM cluster failed to come up (exit {proc.returncode}, prefix {prefix}):\n{proc.stderr}"
        )
    print(
        f"\n[tests/slurm] cluster up in {time.monotonic() - started:.1f} s; SLURM_CONF={env['SLURM_CONF']}",
        file=sys.stderr,
    )
    cluster = Cluster(prefix=prefix, env=env)
    try:
        yield cluster
    finally:
        cluster.cancel_all(list(dict.fromkeys(cluster.submitted)))
        subprocess.run(
            ["bash", str(LOCAL_CLUSTER), "down", str(prefix)],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        if os.environ.get("TRUESTEP_SLURM_KEEP") == "1" or request.session.testsfailed:
            print(f"\n[tests/slurm] kept the cluster prefix (config, logs): {prefix}", file=sys.stderr)
        else:
            shutil.rmtree(prefix, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster: Cluster) -> Iterator[Cluster]:
    """The session's cluster; jobs a test submitted are cancelled when it ends, pass or fail."""
    first = len(slurm_cluster.submitted)
    yield slurm_cluster
    slurm_cluster.cancel_all(list(dict.fromkeys(slurm_cluster.submitted[first:])))


@pytest.fixture(scope="session")
def netns_cluster(request: pytest.FixtureRequest) -> Iterator[NetnsCluster]:
    """A 3-node SLURM cluster of network namespaces (scripts/slurm/netns_cluster.sh), once per session:
    a job of 2 nodes can be requeued onto the spare. Skipped, with the reason, where it cannot run."""
    if os.environ.get("TRUESTEP_SLURM") == "0":
        pytest.skip("SLURM tests disabled by TRUESTEP_SLURM=0")
    if sys.platform != "linux":
        pytest.skip(f"namespace clusters need Linux (this is {sys.platform})")
    prefix = Path(tempfile.mkdtemp(prefix="truestep-netns-"))
    prefix.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env["SLURM_CONF"] = str(prefix / "etc" / "slurm.conf")
    down = ["bash", str(NETNS_CLUSTER), "down", str(prefix)]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", str(NETNS_CLUSTER), "up", str(prefix), "3"],
            env=env,
            capture_output=True,
            text=True,
            timeout=UP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        subprocess.run(down, env=env, timeout=120, check=False)
        pytest.fail(f"namespace cluster did not come up within {UP_TIMEOUT_S} s (prefix {prefix})")
    if proc.returncode == EXIT_UNSUPPORTED:
        reason = (
            "cannot run a namespace SLURM cluster here: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
        )
        print(f"\n[tests/slurm] SKIPPING: {reason}\n{proc.stderr}", file=sys.stderr)
        subprocess.run(down, env=env, timeout=120, check=False)
        shutil.rmtree(prefix, ignore_errors=True)
        pytest.skip(reason)
    if proc.returncode != 0:
        subprocess.run(down, env=env, timeout=120, check=False)
        pytest.fail(
            f"namespace cluster failed to come up (exit {proc.returncode}, prefix {prefix}):\n{proc.stderr}"
        )
    print(f"\n[tests/slurm] namespace cluster up in {time.monotonic() - started:.1f} s", file=sys.stderr)
    cluster = NetnsCluster(prefix=prefix, env=env, nodes=3)
    try:
        yield cluster
    finally:
        cluster.cancel_all(list(dict.fromkeys(cluster.submitted)))
        subprocess.run(down, env=env, capture_output=True, timeout=180, check=False)
        if os.environ.get("TRUESTEP_SLURM_KEEP") == "1" or request.session.testsfailed:
            print(
                f"\n[tests/slurm] kept the namespace cluster prefix (config, logs): {prefix}", file=sys.stderr
            )
        else:
            shutil.rmtree(prefix, ignore_errors=True)


@pytest.fixture
def netns(netns_cluster: NetnsCluster) -> Iterator[NetnsCluster]:
    """The session's namespace cluster with every node up and idle; a test's jobs are cancelled and its
    crashed, partitioned or slowed nodes restored when it ends, pass or fail."""
    netns_cluster.reset()
    first = len(netns_cluster.submitted)
    yield netns_cluster
    netns_cluster.cancel_all(list(dict.fromkeys(netns_cluster.submitted[first:])))
    netns_cluster.reset()


@pytest.fixture(scope="session")
def multinode_reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reference]:
    """The uninterrupted 2-rank run the multi-node runs are compared with, started once per session."""
    ref = Reference(tmp_path_factory.mktemp("multinode-reference") / "run")
    yield ref
    ref.stop()
