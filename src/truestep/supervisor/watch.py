"""Watching one attempt's ranks: exits, start-up deadlines, liveness and progress, all in seconds.

A rank is judged by its process and its heartbeat file:
- it exited with a code that is not a clean ending -> `process_exit`;
- it wrote no heartbeat within `startup_timeout_s` of being spawned (stopped or stuck while importing
  or meeting its peers) -> `startup_timeout`;
- its heartbeat is older than `liveness_timeout_s` (stopped, or the whole process hung) -> `stale_heartbeat`;
  while it is still importing torch (phase `loading`), `startup_timeout_s` if longer: loading native
  libraries holds the GIL, so the heartbeat thread cannot beat (gaps of 1.5 s measured on a loaded 2-core
  machine). Only that phase: a beat's phase can lag the rank's by one interval, and a rank stopped just
  after it left `startup` must still be declared within the liveness timeout;
- it trained but its step did not advance for `hang_allowance()` (hang_timeout_s, or more once a rank
  has reported how long its steps take: resilience.hang_step_multiple) while every rank trained ->
  `no_progress`. A reported step time is a hint, bounded by what the watcher saw itself: never more than
  the longest time it saw that rank's step counter stand still before it moved, plus one beat's lag (a
  forged `longest_step_s` of 1e300 must not turn hang detection off);
- it has been shutting down for longer than the collective timeout allows -> `stuck_in_shutdown`.
And from outside its interpreter (supervisor/outside.py: /proc/PID/stat, `resilience.process_watch`):
- its process has been stopped (state T) for `liveness_timeout_s`, in any phase -> `process_stopped`;
- silent before its first beat or while loading, it sleeps with its CPU time standing still for
  `liveness_timeout_s` -> `no_cpu_progress`; and the start-up deadline and the loading allowance do
  not count time it spent runnable but waiting for a CPU (an overloaded machine's time).
Time the watcher itself did not run (a check more than OBSERVER_PAUSE_S after the previous one: the machine
froze or was overloaded, the VM was descheduled) is not evidence against a rank: every deadline leaves out
the part of such a pause beyond OBSERVER_PAUSE_S, and the pause is reported (`paused_s`). Only that part:
a watcher that is merely slow (every poll 1.2 s apart) still declares a silent rank, a little later.
How the attempt ends when its ranks exit is `rank_exits` (with the one classification of exit codes,
`core.errors.Outcome`). A heartbeat file written by another process (a stale attempt's rank that has not yet seen it is fenced,
in the shared run directory) is not this rank's: its own last beat counts. A multi-node job is also
judged by its other nodes (supervisor/nodes.py): `node_lost`, `attempt_superseded`.
"""

from __future__ import annotations

import enum
import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from truestep.config.schema import ResilienceConfig
from truestep.core.errors import Outcome
from truestep.core.names import heartbeat_path
from truestep.core.status import Phase
from truestep.resilience.heartbeat import read_heartbeat
from truestep.supervisor.node_loss import NodeLoss
from truestep.supervisor.outside import OutsideView

OBSERVER_PAUSE_S = 1.0
"""A gap between two checks longer than this (ten polls) means the watcher was not running."""
MAX_PAUSES = 1000
"""Pauses remembered (the oldest are forgotten: a deadline that old has long been decided)."""


class FailureKind(enum.StrEnum):
    """What the supervisor detected (the `kind` of `failure_detected`)."""

    PROCESS_EXIT = "process_exit"
    """A rank exited out of order (crashed, killed)."""
    STARTUP_TIMEOUT = "startup_timeout"
    """No heartbeat within resilience.startup_timeout_s of the spawn (counted in CPU-available time)."""
    STALE_HEARTBEAT = "stale_heartbeat"
    """A rank's heartbeat stopped for longer than its phase allows."""
    NO_PROGRESS = "no_progress"
    """A training step took longer than the hang allowance while every rank trained."""
    STUCK_IN_SHUTDOWN = "stuck_in_shutdown"
    """A rank has been shutting down longer than the collective timeout allows."""
    PROCESS_STOPPED = "process_stopped"
    """The kernel shows the process stopped (state T) for liveness_timeout_s (supervisor/outside.py)."""
    NO_CPU_PROGRESS = "no_cpu_progress"
    """Silent while starting or loading, asleep, its CPU time standing still for liveness_timeout_s."""
    NODE_LOST = "node_lost"
    """Another node of the job is gone (supervisor/node_loss.py)."""
    ATTEMPT_SUPERSEDED = "attempt_superseded"
    """Node 0 started the next attempt: this node follows it."""


@dataclass
class Failure:
    kind: FailureKind
    rank: int | None
    """The rank judged (None for a node loss)."""
    detail: str
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    loss: NodeLoss | None = None
    """node_lost: which node, how, and who saw it."""
    last_seen: float | None = None
    """Wall clock of the rank's last sign of health the watcher had (its last beat, its last step
    advance, its spawn, the last poll it was running at): the failure came after it, so detection took
    at most `detected_at - last_seen` (analysis/mttr.py, for failures nobody injected)."""

    def to_event(self) -> dict:
        record = {"kind": self.kind, "rank": self.rank, "detail": self.detail}
        if self.last_seen is not None:
            record["last_seen"] = self.last_seen
        record["exit_codes"] = {str(k): v for k, v in self.exit_codes.items()}
        return {**record, **(self.loss.to_event() if self.loss else {})}


class RankProcess(Protocol):
    """What the supervisor does with a rank's process: a fresh one (`subprocess.Popen`) or one its warm
    template forked (supervisor/forked.py `ForkedRank`), its own child either way."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, signum: int) -> None: ...
    def kill(self) -> None: ...


@dataclass
class Rank:
    rank: int
    proc: RankProcess
    spawned_at: float
    """Wall clock at spawn: the start-up deadline counts from here."""


class AttemptWatch:
    """The health rules for one attempt; `check` is called every poll."""

    def __init__(
        self, run_dir: Path, ranks: list[Rank], cfg: ResilienceConfig, longest_step_s: float = 0.0
    ) -> None:
        self.run_dir = run_dir
        self.ranks = ranks
        self.cfg = cfg
        self.longest_step_s = longest_step_s
        """The longest completed step any rank has reported in its heartbeat (`longest_step_s`: batch fetch and
        train step, the first step's warm-up included), this launch's earlier attempts included."""
        self.progress: dict[int, tuple[int, str, float]] = {}
        self.own_beats: dict[int, dict] = {}
        """rank -> the last heartbeat this attempt's own process wrote (the file may hold a stranger's)."""
        self.first_seen: dict[int, tuple[float, float]] = {}
        """rank -> (its last beat's time, when this watcher first saw that beat)."""
        self.last_check: float | None = None
        self.pauses: deque[tuple[float, float]] = deque(maxlen=MAX_PAUSES)
        """(start, end) wall clock of the watcher's own pauses, the latest MAX_PAUSES."""
        self.paused_s: float | None = None
        """The pause the latest `check` found (None: none), for the supervisor's event log."""
        self.outside = OutsideView()
        """Each rank's process as the kernel sees it (supervisor/outside.py)."""
        self.step_seen: dict[int, tuple[int, float]] = {}
        """rank -> (the step its beats show, when this watcher first saw it)."""
        self.step_gap: dict[int, float] = {}
        """rank -> the longest this watcher saw its step stand still before it moved: what bounds the step
        time the rank reports."""

    def hang_allowance(self) -> float:
        """How long a training step may take before it is declared hung."""
        return self.cfg.hang_allowance(self.longest_step_s)[0]

    def _note_step_time(self, step_s: object, bound: float) -> None:
        """A heartbeat's `longest_step_s` (its process's longest completed step), at most `bound`. A
        heartbeat is a control file: anything but a finite positive number (a string, a bool, NaN) changes
        nothing, and a number larger than the watcher saw is taken as `bound`."""
        if isinstance(step_s, int | float) and not isinstance(step_s, bool) and math.isfinite(step_s):
            self.longest_step_s = max(self.longest_step_s, min(float(step_s), bound))

    def _step_time_bound(self, rank: int, step: int, now: float) -> float:
        """The longest a step of `rank` can have taken by what this watcher saw: the longest its step stood
        still before it moved, plus the lag of a beat (one heartbeat interval and one check) at each end."""
        seen = self.step_seen.get(rank)
        if seen is None or seen[0] != step:
            if seen is not None:
                self.step_gap[rank] = max(self.step_gap.get(rank, 0.0), now - seen[1])
            self.step_seen[rank] = (step, now)
        return self.step_gap.get(rank, 0.0) + self.cfg.heartbeat_interval_s + OBSERVER_PAUSE_S

    def _observe(self, now: float) -> None:
        """Note a pause of the watcher itself: what the ranks did in it was not watched, so it does not
        count as their silence or stall (a frozen machine does not make every rank look hung at once)."""
        self.paused_s = None
        if self.last_check is not None and now - self.last_check > OBSERVER_PAUSE_S:
            self.paused_s = now - self.last_check
            self.pauses.append((self.last_check, now))
        self.last_check = now

    def _beat_since(self, rank: int, beat: dict, now: float) -> float:
        """When the rank's last beat was written: its `time`, but never later than when this watcher
        first saw that beat (a heartbeat is a control file: a time ahead of the clock must not hide the
        silence that follows)."""
        stamp = beat["time"]
        seen = self.first_seen.get(rank)
        if seen is None or seen[0] != stamp:
            seen = self.first_seen[rank] = (stamp, now)
        return min(stamp, seen[1])

    def _watched(self, since: float, now: float) -> float:
        """Seconds from `since` to `now` the watcher was awake for: of each pause in between, the part
        beyond OBSERVER_PAUSE_S is left out."""
        unwatched = sum(
            max(0.0, min(end, now) - max(start, since) - OBSERVER_PAUSE_S) for start, end in self.pauses
        )
        return now - since - unwatched

    def _silence_allowed(self, phase: object) -> tuple[float, str]:
        """How long a rank's heartbeat may be silent in `phase`, and the rule that says so."""
        r = self.cfg
        if phase == Phase.LOADING and r.startup_timeout_s > r.liveness_timeout_s:
            return r.startup_timeout_s, f"resilience.startup_timeout_s={r.startup_timeout_s:g} while loading"
        return r.liveness_timeout_s, f"resilience.liveness_timeout_s={r.liveness_timeout_s:g}"

    def _outside(self, rank: Rank, now: float) -> Failure | None:
        """The kernel's view of the rank (supervisor/outside.py): stopped for the liveness timeout, in
        any phase. None where /proc is not there or process_watch is off (the heartbeat rules stand)."""
        if not self.cfg.process_watch:
            return None
        track = self.outside.observe(rank.proc.pid, now)
        if track is None or track.stopped_since is None:
            return None
        r = self.cfg
        if self._watched(track.stopped_since, now) <= r.liveness_timeout_s:
            return None
        detail = (
            f"process {rank.proc.pid} stopped (state {track.last.state} in /proc/{rank.proc.pid}/stat) for "
            f"{now - track.stopped_since:.1f}s (resilience.liveness_timeout_s={r.liveness_timeout_s:g})"
        )
        return Failure(FailureKind.PROCESS_STOPPED, rank.rank, detail, last_seen=track.stopped_since)

    def _asleep(self, rank: Rank, now: float, silent_since: float, where: str) -> Failure | None:
        """A silent rank that sleeps with its CPU time standing still for the liveness timeout is not
        importing or starting anything: stuck (the start-up allowance is for work the heartbeat cannot
        interrupt)."""
        track = self.outside.tracks.get(rank.proc.pid) if self.cfg.process_watch else None
        if track is None or track.idle_since is None:
            return None
        idle_from = max(track.idle_since, silent_since)
        r = self.cfg
        if self._watched(idle_from, now) <= r.liveness_timeout_s:
            return None
        detail = (
            f"no heartbeat and no CPU time used for {now - idle_from:.1f}s, asleep (state "
            f"{track.last.state}) {where} (resilience.liveness_timeout_s={r.liveness_timeout_s:g})"
        )
        return Failure(FailureKind.NO_CPU_PROGRESS, rank.rank, detail, last_seen=idle_from)

    def _charged(self, rank: Rank, since: float, now: float) -> float:
        """Seconds of start-up or loading silence held against the rank: the watched time less the time
        it was runnable and waiting for a CPU (an overloaded machine's, not the rank's)."""
        watched = self._watched(since, now)
        if not self.cfg.process_watch:
            return watched
        return watched - min(watched, self.outside.starved_s(rank.proc.pid, since))

    def check(self) -> Failure | None:
        """Liveness for every phase; progress only while every rank trains; a bound on shutdown.

        Progress is judged job-wide: while any rank is starting, checkpointing or restoring, its peers
        may legitimately sit in a collective waiting for it, so nobody's stall clock runs.
        """
        r = self.cfg
        now = time.time()
        self._observe(now)
        beats: dict[int, dict] = {}
        for rank in self.ranks:
            if rank.proc.poll() is not None:
                continue  # exited: the exit check judges it
            outside = self._outside(rank, now)
            if outside is not None:
                return outside
            beat = read_heartbeat(heartbeat_path(self.run_dir, rank.rank))
            if beat is not None and beat.get("pid") == rank.proc.pid:
                self.own_beats[rank.rank] = beat
            beat = self.own_beats.get(rank.rank)
            if beat is None:
                waited = now - rank.spawned_at
                stuck = self._asleep(rank, now, rank.spawned_at, "while starting")
                if stuck is not None:
                    return stuck
                if self._charged(rank, rank.spawned_at, now) > r.startup_timeout_s:
                    return Failure(
                        FailureKind.STARTUP_TIMEOUT,
                        rank.rank,
                        f"no heartbeat {waited:.1f}s after launch (resilience.startup_timeout_s="
                        f"{r.startup_timeout_s:g}): stopped or stuck while starting",
                        last_seen=rank.spawned_at,
                    )
                continue
            age = now - beat["time"]
            allowed, rule = self._silence_allowed(beat["phase"])
            beat_at = self._beat_since(rank.rank, beat, now)
            silent = self._watched(beat_at, now)
            if beat["phase"] == Phase.LOADING:  # the start-up allowance: the rank's own time only
                stuck = self._asleep(rank, now, beat_at, "while loading")
                if stuck is not None:
                    return stuck
                silent = self._charged(rank, beat_at, now)
            if silent > allowed:
                detail = (
                    f"no heartbeat for {age:.1f}s in phase {beat['phase']} (allowed {allowed:g}s: {rule})"
                )
                return Failure(FailureKind.STALE_HEARTBEAT, rank.rank, detail, last_seen=beat_at)
            beats[rank.rank] = beat
            bound = self._step_time_bound(rank.rank, beat["step"], now)
            self._note_step_time(beat.get("longest_step_s"), bound)
        everyone_training = len(beats) == len(self.ranks) and all(
            b["phase"] == Phase.TRAIN for b in beats.values()
        )
        for rank, beat in beats.items():
            step, phase, since = self.progress.get(rank, (beat["step"], beat["phase"], now))
            if (beat["step"], beat["phase"]) != (step, phase) or (
                phase == Phase.TRAIN and not everyone_training
            ):
                step, phase, since = beat["step"], beat["phase"], now
            self.progress[rank] = (step, phase, since)
            allowance, rule = r.hang_allowance(self.longest_step_s)
            watched = self._watched(since, now)
            if phase == Phase.TRAIN and watched > allowance:
                detail = (
                    f"step {step} has not advanced for {now - since:.1f}s (allowed {allowance:.1f}s: {rule})"
                )
                return Failure(FailureKind.NO_PROGRESS, rank, detail, last_seen=since)
            if phase == Phase.SHUTDOWN and watched > r.collective_timeout_s + 30.0:
                detail = f"still shutting down after {now - since:.1f}s"
                return Failure(FailureKind.STUCK_IN_SHUTDOWN, rank, detail, last_seen=since)
        return None


@dataclass
class AttemptEnd:
    """How one attempt of this node ended, as the restart loop acts on it."""

    outcome: Outcome
    failure: Failure | None = None
    """What was detected (a rank's exit, a hang, a node lost), when the attempt failed."""
    code: int | None = None
    """A rank's exit code that another attempt cannot change (a refusal, a fence, a refusing
    filesystem): the supervisor stops and exits with it."""

    @property
    def word(self) -> str:
        """The supervisor's event vocabulary (supervisor_end's outcome, restart's after)."""
        if self.code is not None:
            return "refused"
        return {Outcome.CLEAN: "completed"}.get(self.outcome, str(self.outcome))


def rank_exits(codes: dict[int, int | None], requeue_code: int) -> AttemptEnd | None:
    """The end of an attempt judged from its ranks' exit codes alone (None: some still run). A rank
    ending out of order fails the attempt at once: a refusal another attempt cannot change stops the
    supervisor with its code (the lowest, when several), any other failure restarts; the rank killed by a
    signal is named as the likely origin. Once all ended in order: completed only when all finished,
    interrupted when any was, else requeue."""
    ended = {r: Outcome.of(c, requeue_code) for r, c in codes.items() if c is not None}
    bad = {r: c for r, c in codes.items() if c is not None and not ended[r].orderly}
    if bad:
        stop = sorted(c for r, c in bad.items() if not ended[r].retryable)
        if stop:
            return AttemptEnd(Outcome.of(stop[0], requeue_code), code=stop[0])
        killed = [r for r, c in bad.items() if c < 0]  # died of a signal: the likely origin
        rank = (killed or sorted(bad))[0]
        return AttemptEnd(Outcome.FAILED, Failure(FailureKind.PROCESS_EXIT, rank, f"exit codes {bad}", codes))
    if len(ended) < len(codes):
        return None
    if all(o == Outcome.CLEAN for o in ended.values()):
        return AttemptEnd(Outcome.CLEAN)
    if any(o == Outcome.INTERRUPTED for o in ended.values()):
        return AttemptEnd(Outcome.INTERRUPTED)
    return AttemptEnd(Outcome.REQUEUE)
