"""What the soak samples while the job runs, from /proc and the run directory (Linux only).

One `Sample` per tick: the supervisor's RSS, open file descriptors and threads; its descendants (ranks
and warm standbys) and the RSS of the parked standbys (children that are not a rank of the current
attempt); the run directory's bytes (all, and without the two append-only logs), events.jsonl bytes,
quarantine entries. `leftovers` checks, after the job, for anything it left: a process, a listening
socket on a port it used, a shared-memory segment that was not there before.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

RECORDS = ("events.jsonl", "metrics.jsonl", "attempts")
"""What a run directory keeps as its record, growing with the work done: the two append-only logs and the
resolved config of every attempt (attempts/, one small file per attempt and node)."""
QUARANTINE = "checkpoints/quarantine"


def _status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def rss_kb(pid: int) -> int:
    return int(_status(pid).get("VmRSS", "0 kB").split()[0])


def threads(pid: int) -> int:
    return int(_status(pid).get("Threads", "0"))


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def identity(pid: int) -> tuple[int, int] | None:
    """(pid, start time in clock ticks): a pid the kernel reuses for another process is another identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return pid, int(stat[stat.rindex(")") + 2 :].split()[19])


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def tree_bytes(root: Path, skip: tuple[str, ...] = ()) -> int:
    """Bytes of the files under `root`, leaving out the paths (relative to it) in `skip`."""
    total = 0
    for base, dirs, files in os.walk(root):
        rel = Path(base).relative_to(root)
        dirs[:] = [d for d in dirs if str(rel / d) not in skip]
        for name in files:
            if str(rel / name) in skip:
                continue
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                continue
    return total


class EventTail:
    """Reads events.jsonl incrementally: the current attempt's rank pids and the ports the job used."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rank_pids: set[int] = set()
        self.ports: set[int] = set()
        self.attempt = -1

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("source") == "supervisor" and record.get("event") == "attempt_start":
                self.rank_pids = set(record["pids"])
                self.ports.add(int(record["master_port"]))
                self.attempt = int(record["attempt"])


@dataclass
class Sample:
    time: float
    launch: int
    attempt: int
    supervisor_rss_kb: int
    supervisor_fds: int
    supervisor_threads: int
    children: int
    standbys: int
    standby_rss_kb: int
    """RSS of the largest parked standby (0 when none is parked)."""
    run_dir_bytes: int
    run_dir_bytes_held: int
    """Without the records (RECORDS) and the quarantine: what keep_last_n and the rest must bound."""
    attempts_bytes: int
    events_bytes: int
    metrics_bytes: int
    quarantine_entries: int
    processes: list[tuple[int, int]] = field(default_factory=list)
    """Identities of the supervisor's running descendants."""

    def record(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "processes"}


def sample(now: float, launch: int, supervisor: int, run_dir: Path, tail: EventTail) -> Sample:
    tail.poll()
    kids = [p for p in descendants(supervisor) if running(p)]
    parked = [p for p in kids if p not in tail.rank_pids]
    quarantine = run_dir / QUARANTINE
    return Sample(
        time=now,
        launch=launch,
        attempt=tail.attempt,
        supervisor_rss_kb=rss_kb(supervisor),
        supervisor_fds=open_fds(supervisor),
        supervisor_threads=threads(supervisor),
        children=len(kids),
        standbys=len(parked),
        standby_rss_kb=max((rss_kb(p) for p in parked), default=0),
        run_dir_bytes=tree_bytes(run_dir),
        run_dir_bytes_held=tree_bytes(run_dir, skip=(*RECORDS, QUARANTINE)),
        attempts_bytes=tree_bytes(run_dir / "attempts"),
        events_bytes=_size(run_dir / "events.jsonl"),
        metrics_bytes=_size(run_dir / "metrics.jsonl"),
        quarantine_entries=len(os.listdir(quarantine)) if quarantine.is_dir() else 0,
        processes=[i for i in map(identity, kids) if i is not None],
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def shared_memory() -> set[str]:
    """POSIX (/dev/shm) and System V shared-memory segments on this machine."""
    found = {f"posix:{name}" for name in os.listdir("/dev/shm")} if os.path.isdir("/dev/shm") else set()
    return found | {f"sysv:{shmid}" for shmid in _sysv()}


def _sysv() -> dict[str, int]:
    """System V segment id -> the pid that created it."""
    try:
        rows = [line.split() for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
    except OSError:
        return {}
    return {row[1]: int(row[4]) for row in rows if len(row) > 4}


def held_by_others(ours: set[int]) -> set[str]:
    """Segments that a running process other than `ours` maps (POSIX) or created (System V): the machine
    is shared, and what other people's processes hold is not this job's leftover."""
    held = {f"sysv:{shmid}" for shmid, creator in _sysv().items() if creator not in ours and running(creator)}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in ours:
            continue
        try:
            maps = Path(f"/proc/{entry}/maps").read_text()
        except OSError:
            continue
        held |= {
            f"posix:{line.rsplit('/dev/shm/', 1)[1].split()[0]}"
            for line in maps.splitlines()
            if "/dev/shm/" in line
        }
    return held


def listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            parts = row.split()
            if len(parts) > 3 and parts[3] == "0A":  # LISTEN
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def leftovers(seen: set[tuple[int, int]], ports: set[int], shm_before: set[str]) -> dict[str, list]:
    """What the job left behind: processes still running, ports still listened on, new shm segments."""
    ours = {pid for pid, _ in seen}
    return {
        "processes": sorted(pid for pid, start in seen if running(pid) and identity(pid) == (pid, start)),
        "listening_ports": sorted(ports & listening_ports()),
        "shared_memory": sorted(shared_memory() - shm_before - held_by_others(ours)),
    }
