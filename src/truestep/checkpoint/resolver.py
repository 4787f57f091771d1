"""The one resolver of what to resume from.

Rank 0 scans the checkpoint root newest-first, verifies, quarantines what fails, and broadcasts the
chosen step to every rank (an integer, not a pickled object). No other code picks a checkpoint.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch
import torch.distributed as dist

from truestep.checkpoint.layout import QUARANTINE, step_dir_name, step_dirs, step_of
from truestep.checkpoint.manifest import VerifyError, verify
from truestep.config.schema import CheckpointConfig
from truestep.parallel.dist import DistContext
from truestep.telemetry.run_logs import RunLogs

NO_CHECKPOINT = -1
NONE_VERIFIED = -2


class ResumeError(RuntimeError):
    """Resuming is impossible or unsafe; the message says what to do."""


def quarantine(ckpt_dir: Path, reason: str, logs: RunLogs) -> Path:
    """Move a checkpoint aside (never delete it) and log why."""
    target_root = ckpt_dir.parent / QUARANTINE
    target_root.mkdir(exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", reason.lower()).strip("-")[:48]
    target = target_root / f"{ckpt_dir.name}.{int(time.time() * 1000)}.{slug}"
    ckpt_dir.rename(target)
    logs.event("checkpoint_quarantined", step=step_of(ckpt_dir), reason=reason, moved_to=str(target))
    return target


def pick_checkpoint(root: Path, cfg: CheckpointConfig, logs: RunLogs) -> int:
    """Rank-0 side: newest complete step, NO_CHECKPOINT, or NONE_VERIFIED."""
    candidates = step_dirs(root)
    if not candidates:
        # Everything already quarantined (say, by a refused start) is not "no checkpoint": a plain
        # restart must refuse again rather than silently train from step 0.
        held = root / QUARANTINE
        if cfg.atomic_commit and held.is_dir() and any(held.iterdir()):
            return NONE_VERIFIED
        return NO_CHECKPOINT
    if not cfg.atomic_commit:
        # Ablation: the naive rule "the directory exists, so it is complete".
        return step_of(candidates[0]) or 0
    for ckpt_dir in candidates:
        started = time.perf_counter()
        try:
            verify(ckpt_dir, cfg.verify_checksums)
        except VerifyError as err:
            quarantine(ckpt_dir, str(err), logs)
            continue
        logs.event(
            "checkpoint_verified",
            step=step_of(ckpt_dir),
            checksums=cfg.verify_checksums,
            verify_s=time.perf_counter() - started,
        )
        return step_of(ckpt_dir) or 0
    return NONE_VERIFIED


def resolve_resume(root: Path, cfg: CheckpointConfig, ctx: DistContext, logs: RunLogs) -> Path | None:
    """Collective. The directory to resume from, or None for a fresh start; raises if unsafe."""
    choice = pick_checkpoint(root, cfg, logs) if ctx.is_main else 0
    if ctx.distributed:
        t = torch.tensor([choice], dtype=torch.int64, device=ctx.device)
        dist.broadcast(t, src=0)
        choice = int(t.item())
    if choice == NONE_VERIFIED:
        if cfg.allow_fresh_start:
            logs.event(
                "fresh_start_forced", reason="no checkpoint verified; checkpoint.allow_fresh_start=true"
            )
            return None
        raise ResumeError(
            f"checkpoints exist under {root} but none verifies (see quarantine/ and events.jsonl); "
            "refusing to start from step 0. Fix or restore a checkpoint, or pass "
            "--checkpoint.allow_fresh_start=true to start over deliberately."
        )
    if choice == NO_CHECKPOINT:
        return None
    return root / step_dir_name(choice)
