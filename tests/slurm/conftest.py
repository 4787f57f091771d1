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
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "slurm"
LOCAL_CLUSTER = SCRIPTS / "local_cluster.sh"
TRAIN_SBATCH = SCRIPTS / "train.sbatch"
EXIT_UNSUPPORTED = 3  # local_cluster.sh: this machine cannot run SLURM
UP_TIMEOUT_S = 300  # apt-get update + install takes ~15 s; a slow mirror much longer
CMD_TIMEOUT_S = 60

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 0.25, diagnose=None) -> T:
    """Poll `check` until it returns something truthy (returned); AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{diagnose()}" if diagnose else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{extra}")
        time.sleep(interval)


def wait_for_line(path: Path, pattern: str, timeout: float, diagnose=None) -> re.Match:
    """Wait until a line of `path` matches the regex `pattern`; returns the first match."""
    regex = re.compile(pattern)

    def check() -> re.Match | None:
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            return None
        return next((m for m in map(regex.search, text.splitlines()) if m), None)

    return wait_for(check, timeout, f"a line matching {pattern!r} in {path}", diagnose=diagnose)


def parse_job(text: str) -> dict[str, str]:
    """`scontrol show job -o` -> {field: value} (values of the fields used here hold no spaces)."""
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


@dataclass
class Cluster:
    prefix: Path
    env: dict[str, str]
    submitted: list[str] = field(default_factory=list)

    # Helpers for the test modules (which cannot import this conftest by name).
    train_sbatch = TRAIN_SBATCH
    wait_for = staticmethod(wait_for)
    wait_for_line = staticmethod(wait_for_line)

    @property
    def logs(self) -> Path:
        return self.prefix / "log"

    def run(
        self, *cmd: str, check: bool = True, timeout: float = CMD_TIMEOUT_S
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc

    def submit(
        self,
        *sbatch_args: str,
        script: Path | None = None,
        script_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> str:
        """sbatch --parsable [ARGS] [SCRIPT [SCRIPT_ARGS]]; returns the job id. `env` is added to the
        environment sbatch exports to the job."""
        script_part = [str(script), *script_args] if script else []
        proc = subprocess.run(
            ["sbatch", "--parsable", *sbatch_args, *script_part],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT_S,
        )
        assert proc.returncode == 0, f"sbatch failed ({proc.returncode}): {proc.stderr}"
        job_id = proc.stdout.strip().split(";")[0]
        self.submitted.append(job_id)
        return job_id

    def job(self, job_id: str) -> dict[str, str]:
        """The job's fields from `scontrol show job` (no sacct here); {} if scontrol has no answer."""
        proc = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        return parse_job(proc.stdout) if proc.returncode == 0 else {}

    def wait_job(
        self,
        job_id: str,
        check: Callable[[dict[str, str]], bool],
        timeout: float,
        what: str,
        diagnose=None,
    ) -> dict[str, str]:
        """Poll `scontrol show job` until check(fields) holds; returns the fields."""
        last: dict[str, str] = {}

        def poll() -> dict[str, str] | None:
            nonlocal last
            last = self.job(job_id)
            return last if last and check(last) else None

        def explain() -> str:
            brief = {k: last.get(k) for k in ("JobState", "Reason", "Restarts", "ExitCode", "RunTime")}
            return f"job {job_id}: {brief}" + (f"\n{diagnose()}" if diagnose else "")

        return wait_for(poll, timeout, f"job {job_id}: {what}", interval=0.2, diagnose=explain)

    def cancel_all(self, job_ids: list[str], timeout: float = 30) -> None:
        """scancel the jobs and wait (bounded) until none of them is left running."""
        if not job_ids:
            return
        self.run("scancel", *job_ids, check=False)
        done = {"CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"}
        try:
            wait_for(
                lambda: all(self.job(j).get("JobState", "CANCELLED") in done for j in job_ids),
                timeout,
                f"jobs {job_ids} to end",
            )
        except AssertionError as err:
            print(f"warning: {err}", file=sys.stderr)


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
