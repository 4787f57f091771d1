"""The restore from a checkpoint directory: everything the mechanisms allow is put back, and one value says
what was (`Restored`, checkpoint/restored.py).

In order: rank 0's rank-state file is read and the trajectory config compared (refused on a difference
unless allowed); each rank loads its DCP shards, hashing every item as it reads it (safe_dcp); its own
rank state (counters, data position, RNG streams: its own on the same layout, re-derived from (seed,
dp rank, step) on another); then the restored parameters are checked against the digest the save
recorded in the checkpoint. Which parts are restored, what a failed load means and whether the digest is
checked come from the `Mechanisms` chosen once (checkpoint/mechanisms.py); nothing here reads a switch.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException

from truestep.checkpoint.errors import CheckpointContentError, ResumeError
from truestep.checkpoint.manifest import VerifyError
from truestep.checkpoint.mechanisms import Mechanisms
from truestep.checkpoint.restored import Restored, RestoreSource, RngPolicy
from truestep.checkpoint.restored_digest import DigestSubject
from truestep.checkpoint.safe_dcp import load_dcp
from truestep.checkpoint.save_record import read_save_record
from truestep.checkpoint.state import Checkpointable, RankState, SavedRankState, read_rank_state
from truestep.config.fingerprint import diff_keys
from truestep.config.schema import CheckpointConfig
from truestep.core.errors import RefusedError
from truestep.parallel.dist import DistContext
from truestep.telemetry.run_logs import RunLogs


def _read_for_resume(ckpt_dir: Path, rank: int) -> SavedRankState:
    try:
        return read_rank_state(ckpt_dir, rank)
    except VerifyError as err:
        raise ResumeError(f"{ckpt_dir}: {err}") from err


def check_config(saved: SavedRankState, current_keys: dict[str, Any], allow_change: bool) -> list[str]:
    """Differences in trajectory-relevant keys; raises unless allowed."""
    differences = diff_keys(saved.config_keys, current_keys)
    if differences and not allow_change:
        raise ResumeError(
            "refusing to resume: the config differs from the checkpoint's in keys that change the "
            "trajectory: " + "; ".join(differences) + ". Restore them, start a new run directory, or "
            "pass --checkpoint.allow_config_change=true to resume anyway."
        )
    return differences


def rng_policy(restore_rng: bool, same_layout: bool) -> RngPolicy:
    if not restore_rng:
        return RngPolicy.FRESH_SEED
    return RngPolicy.RESTORED if same_layout else RngPolicy.REDERIVED


def restore_from_disk(
    states: Checkpointable,
    ckpt_dir: Path,
    cfg: CheckpointConfig,
    ctx: DistContext,
    trajectory_keys: dict[str, Any],
    logs: RunLogs,
    mechanisms: Mechanisms,
) -> Restored:
    """Collective. Restore everything the mechanisms allow from `ckpt_dir`. Raises CheckpointContentError
    on every rank when the checkpoint's bytes turn out bad (the caller quarantines it and falls back)."""
    started = time.perf_counter()
    parts, commit = mechanisms.parts, mechanisms.commit
    shared = _read_for_resume(ckpt_dir, 0)
    differences = check_config(shared, trajectory_keys, cfg.allow_config_change)
    same_layout = shared.layout == ctx.layout()
    try:
        record = read_save_record(ckpt_dir)
    except VerifyError as err:  # verified before the load under the commit protocol; torn under its ablation
        raise CheckpointContentError(f"{ckpt_dir}: {err}") from err

    state = states.dcp_state_dict(with_optimizer=parts.optimizer)
    weights = True
    try:
        load_dcp(state, ckpt_dir, check_items=cfg.verify_checksums)  # each rank hashes what it reads
    except (Exception, CheckpointException) as err:  # DCP's CheckpointException is a BaseException
        weights = commit.load_failed(ckpt_dir, err, logs)
    if weights:
        states.load_dcp_state_dict(state)

    policy = rng_policy(parts.rng, same_layout)
    mine = shared if ctx.rank == 0 or policy != RngPolicy.RESTORED else _read_for_resume(ckpt_dir, ctx.rank)
    own = RankState(shared.state.train_state, shared.state.data_position, mine.state.rng)
    try:
        states.load_rank_state(own, data_position=parts.data_position, rng=policy)
    except (KeyError, TypeError, ValueError, IndexError) as err:  # malformed streams or data position
        if isinstance(err, RefusedError):
            raise
        refusal = ResumeError(
            f"{ckpt_dir}: the rank state of rank {ctx.rank} does not load: {type(err).__name__}: {err}"
        )
        refusal.rank_local = True
        raise refusal from err

    digest = mechanisms.digest.check(
        DigestSubject(states.param_digest, record, not same_layout, ckpt_dir, ctx, logs, commit)
    )
    return Restored(
        step=shared.step or 0,
        source=RestoreSource.DISK,
        path=str(ckpt_dir),
        layout_changed=not same_layout,
        saved_layout=shared.layout,
        rng_policy=policy,
        config_differences=tuple(differences),
        weights=weights,
        optimizer=parts.optimizer and weights,
        data_position=parts.data_position,
        digest=digest.check,
        param_digest=digest.restored,
        saved_param_digest=digest.saved,
        saved_reason=record.reason if record is not None else None,
        restore_s=time.perf_counter() - started,
    )
