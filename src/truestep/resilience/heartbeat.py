"""Per-rank heartbeats for the supervisor: liveness (a timestamp the thread refreshes on its own
schedule, so it keeps beating while the loop is inside a long collective) and progress (the step and
phase, so a rank alive but stuck is visible too).

File: <run.dir>/heartbeats/rankNNNNN.json = {pid, rank, time, step, phase}, replaced atomically.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from truestep.train.trainer import StepResult, Trainer

HEARTBEAT_DIR = "heartbeats"


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    return run_dir / HEARTBEAT_DIR / f"rank{rank:05d}.json"


def read_heartbeat(path: Path) -> dict[str, Any] | None:
    """The last complete heartbeat, or None if none was written yet."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class HeartbeatHook:
    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def on_start(self, trainer: Trainer) -> None:
        if not trainer.cfg.resilience.heartbeat:
            return
        path = heartbeat_path(trainer.run_dir, trainer.ctx.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        interval = trainer.cfg.resilience.heartbeat_interval_s
        self._thread = threading.Thread(
            target=self._beat, args=(trainer, path, interval), name="truestep-heartbeat", daemon=True
        )
        self._thread.start()

    def _beat(self, trainer: Trainer, path: Path, interval: float) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        while True:
            record = {
                "pid": os.getpid(),
                "rank": trainer.ctx.rank,
                "time": time.time(),
                "step": trainer.state.step,
                "phase": trainer.phase,
            }
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path)
            time.sleep(interval)

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        pass

    def on_end(self, trainer: Trainer) -> None:
        # Keep beating until the process exits: shutdown (final digest, process-group teardown,
        # interpreter exit) can take seconds, and a silent rank would look hung. The supervisor bounds
        # the shutdown phase separately.
        pass
