"""Resume rules: nothing verifying, config fingerprints, retention and the naive-commit ablation.
Shared runs: tests/conftest.py, helpers: tests/ckpt_cases.py.
"""

from __future__ import annotations

import signal

import pytest

import harness
from ckpt_cases import (
    DCP_METADATA,
    MARKER,
    QUARANTINE,
    SHARD,
    NaiveCase,
    NoneVerifiesCase,
    assert_same_trajectory,
    attempt_events,
    attempt_loss_bits,
    ckpt,
    last_attempt,
    live_steps,
    quarantined,
    step_dir_name,
    step_dirs,
    step_of,
)
from truestep.checkpoint.integrity import verify
from truestep.checkpoint.saver import Checkpointer
from truestep.config.schema import JobConfig
from truestep.parallel.dist import DistContext
from truestep.telemetry.run_logs import RunLogs

pytestmark = pytest.mark.multiprocess

# ----------------------------------------------------------------------------------------------
# none verifies


def test_none_verifies_refuses_to_start_over(derived_runs):
    case: NoneVerifiesCase = derived_runs["none-verifies"].result()
    assert case.refused.returncode != 0
    assert "none verifies" in case.refused.stderr
    assert "--checkpoint.allow_fresh_start=true" in case.refused.stderr
    assert case.metrics_after_refusal == case.metrics_before  # no step was trained, nothing appended
    assert attempt_events(case.run, "run_start", 1) == []
    events = attempt_events(case.run, "checkpoint_quarantined", 1)
    assert [e["step"] for e in events] == [10, 9, 6, 3]
    assert live_steps(case.run) == [] and len(quarantined(case.run)) == 4


def test_none_verifies_still_refuses_on_the_next_restart(derived_runs):
    case: NoneVerifiesCase = derived_runs["none-verifies"].result()
    assert case.again.returncode != 0, "the second restart trained from step 0 without allow_fresh_start"
    assert "allow_fresh_start" in case.again.stderr
    assert case.metrics_after_again == case.metrics_after_refusal


def test_allow_fresh_start_trains_from_step_zero(derived_runs, reference):
    run, proc = derived_runs["fresh-start"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    attempt = last_attempt(run)
    assert attempt == 1
    assert len(attempt_events(run, "fresh_start_forced", attempt)) == 1
    assert [e["start_step"] for e in attempt_events(run, "run_start", attempt)] == [0]
    assert attempt_events(run, "checkpoint_restore", attempt) == []
    assert len(attempt_events(run, "checkpoint_quarantined", attempt)) == 4
    # Some were refused while loading (their bytes fail their hashes at load time): the fresh start
    # resets the trainer, or the optimizer state materialized for those loads leaks into step 2.
    [reset] = attempt_events(run, "state_reset", attempt)
    assert reset["after_failed_loads"] >= 1
    assert_same_trajectory(run, reference, attempt=attempt, first_step=1)


# ----------------------------------------------------------------------------------------------
# config fingerprint


def test_resume_with_a_different_seed_is_refused(derived_runs):
    run, before, proc = derived_runs["config/seed"].result()
    assert proc.returncode != 0
    assert "train.seed: 0 -> 7" in proc.stderr
    assert "allow_config_change" in proc.stderr
    assert (run / "metrics.jsonl").read_bytes() == before
    # A config mismatch is not corruption: nothing is quarantined.
    assert live_steps(run) == [6, 3] and quarantined(run) == []


def test_resume_with_a_different_seed_when_allowed(derived_runs):
    run, _, proc = derived_runs["config/seed-allowed"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    (restore,) = attempt_events(run, "checkpoint_restore", 1)
    assert restore["step"] == 6
    assert restore["config_differences"] == ["train.seed: 0 -> 7"]
    assert sorted(attempt_loss_bits(run, 1)) == [7, 8, 9, 10]


def test_resume_with_non_trajectory_changes_is_accepted(derived_runs, reference):
    run, _, proc = derived_runs["config/harmless"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    (restore,) = attempt_events(run, "checkpoint_restore", 1)
    assert restore["step"] == 6 and restore["config_differences"] == []
    # The new interval took effect, and the trajectory is the reference's.
    assert [e["step"] for e in attempt_events(run, "checkpoint_save", 1)] == [8, 10]
    assert_same_trajectory(run, reference, attempt=1, first_step=7)


# ----------------------------------------------------------------------------------------------
# retention


def test_keep_last_n_keeps_the_newest_committed(independent_runs):
    run = independent_runs["retention"].result()
    assert live_steps(run) == [10, 8]
    for step in (10, 8):
        verify(ckpt(run, step), checksums=True)
    assert [e["step"] for e in harness.events(run, "checkpoint_removed")] == [2, 4, 6]
    assert {e["reason"] for e in harness.events(run, "checkpoint_removed")} == {"keep_last_n=2"}


def test_retention_never_touches_uncommitted_or_quarantined(tmp_path):
    cfg = JobConfig()
    cfg.checkpoint.keep_last_n = 2
    cfg.checkpoint.dir = str(tmp_path / "checkpoints")
    logs = RunLogs(tmp_path, attempt=0, enabled=True)
    root = tmp_path / "checkpoints"
    checkpointer = Checkpointer(root, cfg.checkpoint, DistContext(), logs, {}, lambda: None, 0)
    for step in (1, 2, 3, 4, 5):
        (root / step_dir_name(step)).mkdir(parents=True)
        (root / step_dir_name(step) / MARKER).write_text("{}")
    (root / step_dir_name(99)).mkdir()  # being written (or torn): no marker
    (root / step_dir_name(99) / SHARD).write_bytes(b"x")
    (root / QUARANTINE / "step_00000007.1.missing-committed").mkdir(parents=True)
    checkpointer._retain()
    logs.close()
    assert [step_of(p) for p in step_dirs(root)] == [99, 5, 4]
    assert (root / QUARANTINE / "step_00000007.1.missing-committed").is_dir()
    assert [e["step"] for e in harness.events(tmp_path, "checkpoint_removed")] == [3, 2, 1]


# ----------------------------------------------------------------------------------------------
# the naive-commit ablation


def test_naive_mode_resumes_from_the_torn_directory(independent_runs, reference_future):
    """--checkpoint.atomic_commit=false: "the directory exists, so it is complete". After a crash
    between this rank's shards and the coordinator's .metadata, the resolver picks the torn step 6 (no
    verification, no quarantine); like a naive trainer it restores what is there (counters and data
    position, not the weights), logs `naive_partial_restore` and carries on: no crash, a different
    trajectory from step 7 on. The restored-digest check reports, not acts (nothing is quarantined in
    this mode), and the run's own resume self-check flags the resume at step 7 without a reference."""
    case: NaiveCase = independent_runs["naive"].result()
    assert case.crashed.returncode == -signal.SIGKILL
    assert "truestep fault: crash at save:mid-shards step=6" in case.crashed.stderr
    assert case.resumed.returncode == 0, case.resumed.stderr[-3000:]
    assert quarantined(case.run) == [] and harness.events(case.run, "checkpoint_quarantined") == []
    assert harness.events(case.run, "checkpoint_verified") == []
    [partial] = harness.events(case.run, "naive_partial_restore")
    assert DCP_METADATA in partial["error"]
    [restore] = harness.events(case.run, "checkpoint_restore")
    assert restore["step"] == 6 and restore["restored_weights"] is False
    assert restore["restored_digest"].startswith("differs")
    [mismatch] = harness.events(case.run, "restore_digest_mismatch")
    assert mismatch["quarantined"] is False
    [flag] = harness.events(case.run, "resume_diverged")
    assert flag["first_step"] == 7 and "resume DIVERGED at step 7" in case.resumed.stderr
    got, want = harness.loss_bits_by_step(case.run), harness.loss_bits_by_step(reference_future.result())
    assert all(got[s] == want[s] for s in range(1, 7))
    assert [s for s in range(7, max(want) + 1) if got[s] != want[s]][:1] == [7]
