"""The SLURM test clusters as objects: submit jobs, read `scontrol show job`, wait (bounded) for states,
and, on the namespace cluster (scripts/slurm/netns_cluster.sh), act on nodes: crash, boot, partition,
heal, slow down, run a command inside one. Used by conftest.py's fixtures and the tests."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "slurm"
LOCAL_CLUSTER = SCRIPTS / "local_cluster.sh"
NETNS_CLUSTER = SCRIPTS / "netns_cluster.sh"
TRAIN_SBATCH = SCRIPTS / "train.sbatch"
EXIT_UNSUPPORTED = 3  # local_cluster.sh, netns_cluster.sh: this machine cannot do it
UP_TIMEOUT_S = 300  # apt-get update + install takes ~15 s; a slow mirror much longer
CMD_TIMEOUT_S = 60

T = TypeVar("T")


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log, for an assertion message."""
    try:
        return f"--- {path} (tail) ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"--- {path}: not written yet ---"


class BackgroundRun:
    """An uninterrupted reference run started in the background (not under SLURM), awaited on use;
    its output goes to `reference.log` beside the run directory."""

    def __init__(self, run_dir: Path, cmd: list[str], env: dict[str, str], timeout: float) -> None:
        self.run_dir = run_dir
        self.log = run_dir.parent / "reference.log"
        self.timeout = timeout
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.started = time.monotonic()

    def result(self) -> Path:
        """The run directory once the run exited 0 (`timeout` counts from the start)."""
        try:
            rc = self.proc.wait(timeout=max(1.0, self.timeout - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(
                f"reference run did not finish in {self.timeout} s\n{tail(self.log)}"
            ) from None
        assert rc == 0, f"reference run exited {rc}\n{tail(self.log)}"
        return self.run_dir

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


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


UP_STATES = {"idle", "mixed", "allocated"}


@dataclass
class NetnsCluster(Cluster):
    """The namespace cluster: nodes n1..nN, each its own network namespace, address, hostname, slurmd."""

    nodes: int = 3

    def tool(self, action: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """netns_cluster.sh ACTION PREFIX ARGS..."""
        return self.run("bash", str(NETNS_CLUSTER), action, str(self.prefix), *args, check=check)

    def addr(self, node: str) -> str:
        return self.tool("addr", node).stdout.strip()

    def crash(self, node: str) -> float:
        """SIGKILL every process of the node (its slurmd too); returns the wall clock just before."""
        started = time.time()
        self.tool("crash", node)
        return started

    def partition(self, node: str) -> float:
        started = time.time()
        self.tool("partition", node)
        return started

    def heal(self, node: str) -> None:
        self.tool("heal", node)

    def processes(self, node: str) -> dict[int, str]:
        """pid -> command line of the truestep processes (launchers, ranks) inside the node."""
        found = {}
        for pid in self.tool("pids", node).stdout.split():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue  # exited meanwhile
            if any(arg == "truestep" or arg.endswith("/truestep") for arg in argv):
                found[int(pid)] = " ".join(argv)
        return found

    def popen(self, node: str, cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        """Start `cmd` inside the node (its network, its hostname), output to `log`."""
        with open(log, "w") as out:
            return subprocess.Popen(
                ["bash", str(NETNS_CLUSTER), "exec", str(self.prefix), node, *cmd],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split("\n")
        return dict(line.split() for line in out if len(line.split()) == 2)

    def reset(self, timeout: float = 60) -> None:
        """Every node back: links up, no slow-link qdisc, slurmd running, idle (not down or drained)."""
        for index in range(1, self.nodes + 1):
            node = f"n{index}"
            self.tool("heal", node)
            self.tool("fast", node)
            if not (self.prefix / "run" / f"slurmd-{node}.pid").exists() or not self._slurmd_alive(node):
                self.tool("boot", node, check=False)  # it waits for idle; judged below

        def settled() -> bool:
            states = self.node_states()
            for node, state in states.items():
                if state.rstrip("*~#") not in UP_STATES:
                    self.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
            return len(states) == self.nodes and all(s in UP_STATES for s in states.values())

        wait_for(settled, timeout, "every node idle", interval=0.5, diagnose=lambda: str(self.node_states()))

    def _slurmd_alive(self, node: str) -> bool:
        """Its slurmd runs (a killed one may linger as a zombie until something reaps it)."""
        try:
            pid = int((self.prefix / "run" / f"slurmd-{node}.pid").read_text().strip())
            status = Path(f"/proc/{pid}/status").read_text()
        except (OSError, ValueError):
            return False
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return fields.get("Name", "").strip() == "slurmd" and fields.get("State", "Z").strip()[:1] not in "ZX"
