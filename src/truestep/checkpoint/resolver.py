"""Which checkpoint to use: the resume decision, `init_from`, and the read-only "newest verified".

Every collective decision is taken on rank 0 alone and broadcast as one integer (never a pickled
object), so ranks cannot disagree and then hang in a collective load. Resume quarantines what fails;
the read-only lookups (export, init_from, generate) never move anything.

Resume rules, judged from what is on disk:
- the newest live checkpoint that verifies is used; each one that fails before it is quarantined;
- if none verifies and a commit marker exists anywhere (live or quarantined), committed work was
  corrupted: refuse (unless `checkpoint.allow_fresh_start`), on every restart, until a human decides;
- if none verifies and no marker exists, nothing was ever committed (a fault during the first save):
  start from step 0, with a `fresh_start` event and a console line saying what was quarantined.
- an entry named like a checkpoint that is not a real directory (a symlink, a file) is never read or
  written through: it is moved to quarantine/ first, so the save of that step cannot follow it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from truestep.checkpoint.catalog import (
    checkpoint_root,
    committed_dirs,
    ever_committed,
    is_committed,
    quarantine,
    quarantined_dirs,
    step_dir_name,
    step_dirs,
    step_of,
    stray_step_entries,
    supersede,
)
from truestep.checkpoint.errors import CheckpointNotFound, ResumeError
from truestep.checkpoint.integrity import verification_problem
from truestep.config.schema import CheckpointConfig
from truestep.core.errors import RefusedError, TruestepError, os_error_line, storage_error
from truestep.core.fsio import check_writable, make_dir
from truestep.parallel.dist import DistContext, broadcast_int
from truestep.telemetry.run_logs import RunLogs

if TYPE_CHECKING:
    from truestep.checkpoint.commit_protocol import CommitProtocol

__all__ = ["CheckpointNotFound", "ResumeError"]

NO_CHECKPOINT = -1
NONE_VERIFIED = -2
REFUSED = -3


def quarantine_logged(ckpt_dir: Path, reason: str, logs: RunLogs) -> Path:
    """Quarantine a checkpoint and record why in the event log (`ckpt list` shows the reason)."""
    target = quarantine(ckpt_dir, reason)
    logs.event("checkpoint_quarantined", step=step_of(ckpt_dir), reason=reason, moved_to=str(target))
    return target


def set_aside_strays(root: Path, logs: RunLogs) -> None:
    """Quarantine step-named entries that are not real directories (symlinks, files): never checkpoints."""
    for entry in stray_step_entries(root):
        quarantine_logged(entry, "not a real directory (a symlink or a file): never a checkpoint", logs)


def pick_verified(root: Path, cfg: CheckpointConfig, logs: RunLogs) -> int:
    """Rank-0 side of the commit protocol: the newest checkpoint that verifies (each one that fails
    before it is quarantined), NONE_VERIFIED when committed work exists but none verifies, else
    NO_CHECKPOINT."""
    set_aside_strays(root, logs)
    quarantined: list[str] = []
    for ckpt_dir in step_dirs(root):
        started = time.perf_counter()
        # Shard bytes are hashed by the ranks that load them, as they load them (checkpoint/restore.py).
        problem = verification_problem(ckpt_dir, cfg.verify_checksums, items_on_read=True)
        if problem is not None:
            quarantined.append(quarantine_logged(ckpt_dir, problem, logs).name)
            continue
        logs.event(
            "checkpoint_verified",
            step=step_of(ckpt_dir),
            checksums=cfg.verify_checksums,
            shard_bytes="hashed while loading",
            verify_s=time.perf_counter() - started,
        )
        return step_of(ckpt_dir) or 0
    if ever_committed(root):
        return NONE_VERIFIED
    return nothing_to_resume(root, quarantined, logs)


def pick_resume(root: Path, cfg: CheckpointConfig, logs: RunLogs) -> int:
    """Rank 0: the step a resume under `cfg`'s commit protocol would use (for callers without a chosen
    set of mechanisms: tests, tools)."""
    from truestep.checkpoint.mechanisms import choose  # mechanisms -> commit_protocol -> this module

    return choose(cfg).commit.pick(root, cfg, logs)


def nothing_to_resume(root: Path, quarantined_now: list[str], logs: RunLogs) -> int:
    """NO_CHECKPOINT: nothing was ever committed. When something torn was set aside, say so."""
    held = quarantined_dirs(root)
    if held:
        reason = "no checkpoint was ever committed (no commit marker on disk); starting from step 0"
        logs.event(
            "fresh_start",
            reason=reason,
            quarantined_now=quarantined_now,
            in_quarantine=[p.name for p in held],
        )
        print(f"truestep: {reason}; quarantined: {', '.join(quarantined_now) or 'earlier'}", file=sys.stderr)
    return NO_CHECKPOINT


def decide_on_rank0(decide: Callable[[], int], ctx: DistContext) -> int:
    """Collective: run `decide` on rank 0 only and broadcast its integer. If it raises, every rank
    raises (rank 0 its own error, the others one that points at rank 0) instead of hanging."""
    error: BaseException | None = None
    choice = 0
    if ctx.is_main:
        try:
            choice = decide()
        except TruestepError as err:
            error, choice = err, REFUSED
        except OSError as err:  # the filesystem, not a bug: one line, and a code that says which
            refusal = storage_error(err, "checkpoint directory") or RefusedError(os_error_line(err))
            error, choice = refusal.with_traceback(err.__traceback__), REFUSED
    choice = broadcast_int(choice, ctx)
    if choice == REFUSED:
        if error is not None:
            raise error
        raise ResumeError("rank 0 refused to start; its message says why")
    return choice


def _check_writable(root: Path) -> None:
    """Find an unwritable checkpoint directory now, not at the first save after the work is done."""
    try:
        make_dir(root)
        check_writable(root)
    except OSError as err:
        raise ResumeError(f"checkpoint directory {root} is not writable: {err.strerror or err}") from err


def _set_aside_for_fresh_start(root: Path, cfg: CheckpointConfig, logs: RunLogs) -> int:
    """resume=false: refuse to write over another trajectory's committed checkpoints unless told to
    (`overwrite`), and then move them to superseded/ (kept) so no later resume mixes the two."""
    set_aside_strays(root, logs)
    committed = committed_dirs(root)
    if committed and not cfg.overwrite:
        raise ResumeError(
            f"checkpoint.resume=false but {root} holds committed checkpoints of an earlier run "
            f"({', '.join(d.name for d in committed[:3])}{', ...' if len(committed) > 3 else ''}); "
            "pass --checkpoint.overwrite=true to set them aside, or use another checkpoint.dir / run.dir"
        )
    for ckpt_dir in step_dirs(root):
        if is_committed(ckpt_dir):
            why = "superseded by a fresh start (checkpoint.overwrite=true)"
            moved = supersede(ckpt_dir, why)
        else:
            why = "torn (never committed), found at a fresh start"
            moved = quarantine(ckpt_dir, why)
        logs.event("checkpoint_set_aside", step=step_of(ckpt_dir), reason=why, moved_to=str(moved))
    return NO_CHECKPOINT


def resolve_start(
    root: Path, cfg: CheckpointConfig, ctx: DistContext, logs: RunLogs, commit: CommitProtocol
) -> Path | None:
    """Collective. Where this attempt starts: a checkpoint directory to resume from, or None (step 0).
    Raises ResumeError (on every rank) if starting is unsafe."""

    def decide() -> int:
        _check_writable(root)
        if not cfg.resume:
            return _set_aside_for_fresh_start(root, cfg, logs)
        return commit.pick(root, cfg, logs)

    choice = decide_on_rank0(decide, ctx)
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


def resolve_rollback(
    root: Path, cfg: CheckpointConfig, ctx: DistContext, logs: RunLogs, commit: CommitProtocol
) -> Path:
    """Collective. The newest verified checkpoint for a NaN rollback; raises if there is none."""
    choice = decide_on_rank0(lambda: commit.pick(root, cfg, logs), ctx)
    if choice < 0:
        raise ResumeError("rollback requested but there is no verified checkpoint to roll back to")
    return root / step_dir_name(choice)


def find_verified(path: Path, checksums: bool) -> Path:
    """Read-only. `path` is a `step_XXXXXXXX` directory (which must verify), or a run directory /
    checkpoint root, whose newest checkpoint that verifies is used. Raises CheckpointNotFound saying why."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointNotFound(f"{path}: no such checkpoint directory")
    if step_of(path) is not None:
        problem = verification_problem(path, checksums)
        if problem is not None:
            raise CheckpointNotFound(
                f"{path} does not verify ({problem}); refusing to read an incomplete or corrupted checkpoint"
            )
        return path
    candidates = step_dirs(checkpoint_root(path))
    if not candidates:
        raise CheckpointNotFound(
            f"{path}: not a checkpoint directory (step_XXXXXXXX) and holds no checkpoints "
            "(neither directly nor under checkpoints/)"
        )
    reasons = []
    for candidate in candidates:
        problem = verification_problem(candidate, checksums)
        if problem is None:
            return candidate
        reasons.append(f"{candidate.name}: {problem}")
    raise CheckpointNotFound(f"no checkpoint under {path} verifies: " + "; ".join(reasons))


def find_verified_collective(path: Path, checksums: bool, ctx: DistContext) -> Path:
    """Collective `find_verified`: rank 0 hashes and decides, every rank gets the same directory (or
    every rank raises), so no rank can go on to a collective load the others will not join."""
    path = Path(path)
    step = decide_on_rank0(lambda: step_of(find_verified(path, checksums)) or 0, ctx)
    return path if step_of(path) == step else checkpoint_root(path) / step_dir_name(step)
