"""End-to-end integrity of the commit protocol: crashes at every save phase, on-disk corruption,
planted pickles, nothing verifying, config fingerprints, retention and the naive-commit ablation.

Real `truestep train` processes (tests/harness.py) on the tiny model. Startup dominates a run, so the
runs are submitted to a small thread pool (TRUESTEP_TEST_JOBS, default min(4, cpus)) from module-scoped
fixtures and shared: one uninterrupted reference run, then independent crash/resume pairs, then
destructive cases that each work on their own `shutil.copytree` of the reference run directory. Tests
only wait for their own job.

Trajectory claims are bitwise: fp32 loss bit patterns per step (`harness.loss_bits_by_step`) and the
final parameter digest (`harness.final_digest`) must equal the reference run's.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

import harness
from truestep.checkpoint.layout import MANIFEST, MARKER, QUARANTINE, step_dir_name, step_dirs, step_of
from truestep.checkpoint.manifest import VerifyError, verify, write_manifest, write_marker
from truestep.checkpoint.safe_dcp import UnsafeCheckpointError, safe_load_metadata
from truestep.checkpoint.saver import Checkpointer
from truestep.config.schema import JobConfig
from truestep.faults.hooks import ENV_VAR as FAULTS_ENV
from truestep.parallel.dist import DistContext
from truestep.telemetry.run_logs import RunLogs

# The reference trajectory: 10 steps, a checkpoint every 3 (3, 6, 9) plus the final one (10).
# keep_last_n is not a trajectory key; 0 keeps every checkpoint so copies can start from any of them.
RUN = ("--train.max_steps=10", "--checkpoint.interval=3")
REFERENCE = (*RUN, "--checkpoint.keep_last_n=0")
MAX_STEPS = 10
SHARD = "__0_0.distcp"
RANK0 = "rank00000.json"
DCP_METADATA = ".metadata"
JOBS = max(1, min(4, int(os.environ.get("TRUESTEP_TEST_JOBS", "0")) or (os.cpu_count() or 1)))

# ----------------------------------------------------------------------------------------------
# helpers


def ckpt_root(run: Path) -> Path:
    return run / "checkpoints"


def ckpt(run: Path, step: int) -> Path:
    return ckpt_root(run) / step_dir_name(step)


def live_steps(run: Path) -> list[int]:
    return [step_of(p) for p in step_dirs(ckpt_root(run))]


def quarantined(run: Path) -> list[Path]:
    q = ckpt_root(run) / QUARANTINE
    return sorted(q.iterdir()) if q.is_dir() else []


def last_attempt(run: Path) -> int:
    return max(e["attempt"] for e in harness.events(run, "run_start"))


def attempt_events(run: Path, name: str, attempt: int) -> list[dict]:
    return [e for e in harness.events(run, name) if e["attempt"] == attempt]


def attempt_loss_bits(run: Path, attempt: int) -> dict[int, str]:
    return {m["step"]: harness.bits(m["loss"]) for m in harness.metrics(run) if m["attempt"] == attempt}


def file_hashes(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def copy_run(src: Path, dest: Path, keep: tuple[int, ...] | None = None) -> Path:
    """A private copy of a run directory; `keep` drops every other checkpoint, as if the run had
    stopped after the newest kept step (the metrics of later steps stay, tagged with attempt 0)."""
    shutil.copytree(src, dest)
    if keep is not None:
        for path in step_dirs(ckpt_root(dest)):
            if step_of(path) not in keep:
                shutil.rmtree(path)
    return dest


def recommit(ckpt_dir: Path) -> None:
    """What an attacker who can write the directory does: rewrite manifest and marker consistently."""
    step = step_of(ckpt_dir)
    assert step is not None
    write_marker(ckpt_dir, step, write_manifest(ckpt_dir, step))


def assert_same_trajectory(run: Path, reference: Path, attempt: int, first_step: int) -> None:
    """The given attempt recomputed steps first_step..MAX_STEPS bit-for-bit like the reference."""
    ref_bits = harness.loss_bits_by_step(reference)
    assert sorted(ref_bits) == list(range(1, MAX_STEPS + 1))
    resumed = attempt_loss_bits(run, attempt)
    assert sorted(resumed) == list(range(first_step, MAX_STEPS + 1))
    for step, value in resumed.items():
        assert value == ref_bits[step], f"step {step}: loss bits {value} != reference {ref_bits[step]}"
    assert harness.loss_bits_by_step(run) == ref_bits
    assert harness.final_digest(run) == harness.final_digest(reference)


class Evil:
    """Unpickling this runs `os.system` (pickled as posix.system): creates `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch '{self.path}'",))


class EvilExec:
    """Unpickling this runs `builtins.exec`: creates `path` without a shell."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (exec, (f"open({str(self.path)!r}, 'w').close()",))


# ----------------------------------------------------------------------------------------------
# shared runs


@pytest.fixture(scope="module")
def pool():
    executor = ThreadPoolExecutor(max_workers=JOBS)
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)  # after -x, do not run what nobody waits for


@pytest.fixture(scope="module")
def reference_future(pool, tmp_path_factory) -> Future:
    run = tmp_path_factory.mktemp("reference") / "run"

    def job() -> Path:
        harness.launch(run, *REFERENCE)
        return run

    return pool.submit(job)


@pytest.fixture(scope="module")
def reference(reference_future) -> Path:
    return reference_future.result()


CRASH_POINTS = (
    "save:before-shards",
    "save:mid-shards",
    "save:after-shards",
    "save:before-manifest",
    "save:before-marker",
    "save:after-marker",
)
CRASH_CASES = [(point, "async") for point in CRASH_POINTS] + [
    ("save:mid-shards", "sync"),
    ("save:before-marker", "sync"),
]
# What the step-6 directory holds when the process dies at each point (DCP writes the shard, then
# the coordinator's .metadata; rank state is written before DCP starts).
FILES_AT_CRASH = {
    "save:before-shards": [],
    "save:mid-shards": [SHARD, RANK0],
    "save:after-shards": [DCP_METADATA, SHARD, RANK0],
    "save:before-manifest": [DCP_METADATA, SHARD, RANK0],
    "save:before-marker": [DCP_METADATA, SHARD, MANIFEST, RANK0],
    "save:after-marker": [DCP_METADATA, MARKER, SHARD, MANIFEST, RANK0],
}


@dataclass
class CrashCase:
    run: Path
    crashed: subprocess.CompletedProcess
    files_after_crash: dict[int, list[str]]
    resumed: subprocess.CompletedProcess


def _crash_job(run: Path, point: str, mode: str) -> CrashCase:
    switch = f"--checkpoint.async_save={'true' if mode == 'async' else 'false'}"
    crashed = harness.launch(run, *RUN, switch, env={FAULTS_ENV: f"crash:at={point}:step=6"}, check=False)
    files = {step_of(p): sorted(f.name for f in p.iterdir()) for p in step_dirs(ckpt_root(run))}
    resumed = harness.launch(run, *RUN, switch, check=False)
    return CrashCase(run, crashed, files, resumed)


@dataclass
class NaiveCase:
    run: Path
    crashed: subprocess.CompletedProcess
    resumed: subprocess.CompletedProcess


def _naive_job(run: Path) -> NaiveCase:
    naive = "--checkpoint.atomic_commit=false"
    fault = {FAULTS_ENV: "crash:at=save:mid-shards:step=6"}
    crashed = harness.launch(run, *RUN, naive, env=fault, check=False)
    resumed = harness.launch(run, *RUN, naive, check=False)
    return NaiveCase(run, crashed, resumed)


def _retention_job(run: Path) -> Path:
    harness.launch(run, "--train.max_steps=10", "--checkpoint.interval=2", "--checkpoint.keep_last_n=2")
    return run


@pytest.fixture(scope="module")
def independent_runs(pool, reference_future, tmp_path_factory) -> dict[str, Future]:
    """Runs that need nothing but a fresh directory (queued behind the reference run)."""
    base = tmp_path_factory.mktemp("independent")
    jobs: dict[str, Future] = {}
    for point, mode in CRASH_CASES:
        name = f"{point.replace(':', '_')}-{mode}"
        jobs[f"crash/{point}/{mode}"] = pool.submit(_crash_job, base / name, point, mode)
    jobs["naive"] = pool.submit(_naive_job, base / "naive")
    jobs["retention"] = pool.submit(_retention_job, base / "retention")
    return jobs


# --- destructive cases on copies of the reference run


def _truncate(d: Path) -> str:
    data = (d / SHARD).read_bytes()
    (d / SHARD).write_bytes(data[: len(data) // 2])
    return f"{SHARD}: size {len(data) // 2} != manifest {len(data)} (truncated?)"


def _flip_byte(d: Path) -> str:
    data = bytearray((d / SHARD).read_bytes())
    data[len(data) // 2] ^= 0x40
    (d / SHARD).write_bytes(bytes(data))
    return f"{SHARD}: SHA-256 mismatch (corrupted)"


def _remove_metadata(d: Path) -> str:
    (d / DCP_METADATA).unlink()
    return f"missing file {DCP_METADATA}"


def _tamper_manifest(d: Path) -> str:
    manifest = json.loads((d / MANIFEST).read_text())
    manifest["files"][SHARD]["size"] += 1
    (d / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return "manifest.json does not match the commit marker (tampered or torn)"


def _plant_file(d: Path) -> str:
    (d / "planted.bin").write_bytes(b"\0" * 64)
    return "files not in the manifest: planted.bin"


def _bad_marker(d: Path) -> str:
    (d / MARKER).write_text('{"step": 6, "manifest_sha256": ')
    return "COMMITTED is not valid JSON"


CORRUPTIONS: dict[str, Callable[[Path], str]] = {
    "truncated-shard": _truncate,
    "flipped-byte": _flip_byte,
    "missing-file": _remove_metadata,
    "tampered-manifest": _tamper_manifest,
    "planted-file": _plant_file,
    "bad-marker-json": _bad_marker,
}


@dataclass
class CorruptionCase:
    run: Path
    reason: str
    corrupted: dict[str, str]
    proc: subprocess.CompletedProcess


def _corruption_job(reference: Path, run: Path, corrupt: Callable[[Path], str]) -> CorruptionCase:
    copy_run(reference, run, keep=(3, 6))
    reason = corrupt(ckpt(run, 6))
    corrupted = file_hashes(ckpt(run, 6))
    return CorruptionCase(run, reason, corrupted, harness.launch(run, *RUN, check=False))


@dataclass
class PickleCase:
    run: Path
    marker: Path
    verified_before: bool
    metrics_before: bytes
    proc: subprocess.CompletedProcess


def _pickle_job(reference: Path, run: Path, target: str) -> PickleCase:
    copy_run(reference, run, keep=(3, 6))
    marker = run.parent / f"pwned-{target.strip('.')}"
    (ckpt(run, 6) / target).write_bytes(pickle.dumps(Evil(marker), protocol=2))
    recommit(ckpt(run, 6))
    try:
        verify(ckpt(run, 6), checksums=True)
        verified = True
    except VerifyError:
        verified = False
    before = (run / "metrics.jsonl").read_bytes()
    return PickleCase(run, marker, verified, before, harness.launch(run, *RUN, check=False))


def _corrupt_all(run: Path) -> None:
    for path, corrupt in zip(step_dirs(ckpt_root(run)), CORRUPTIONS.values(), strict=False):
        corrupt(path)


@dataclass
class NoneVerifiesCase:
    run: Path
    metrics_before: bytes
    refused: subprocess.CompletedProcess
    metrics_after_refusal: bytes
    again: subprocess.CompletedProcess
    again_run: Path
    metrics_after_again: bytes = field(default=b"")


def _none_verifies_job(reference: Path, base: Path) -> NoneVerifiesCase:
    run = copy_run(reference, base / "run")
    _corrupt_all(run)
    before = (run / "metrics.jsonl").read_bytes()
    refused = harness.launch(run, *RUN, check=False)
    after = (run / "metrics.jsonl").read_bytes()
    # The operator (or the cluster's auto-restart) simply runs the same command again.
    again_run = copy_run(run, base / "again")
    again = harness.launch(again_run, *RUN, check=False)
    case = NoneVerifiesCase(run, before, refused, after, again, again_run)
    case.metrics_after_again = (again_run / "metrics.jsonl").read_bytes()
    return case


def _fresh_start_job(reference: Path, run: Path) -> tuple[Path, subprocess.CompletedProcess]:
    copy_run(reference, run)
    _corrupt_all(run)
    return run, harness.launch(run, *RUN, "--checkpoint.allow_fresh_start=true", check=False)


def _config_job(
    reference: Path, run: Path, *overrides: str
) -> tuple[Path, bytes, subprocess.CompletedProcess]:
    copy_run(reference, run, keep=(3, 6))
    before = (run / "metrics.jsonl").read_bytes()
    return run, before, harness.launch(run, *RUN, *overrides, check=False)


CONFIG_CASES = {
    "seed": ("--train.seed=7",),
    "seed-allowed": ("--train.seed=7", "--checkpoint.allow_config_change=true"),
    "harmless": ("--metrics.progress=true", "--checkpoint.interval=2"),
}


@pytest.fixture(scope="module")
def derived_runs(pool, reference, tmp_path_factory) -> dict[str, Future]:
    """Destructive cases, each on its own copy of the reference run directory."""
    base = tmp_path_factory.mktemp("derived")
    jobs: dict[str, Future] = {}
    (base / "none-verifies").mkdir()
    jobs["none-verifies"] = pool.submit(_none_verifies_job, reference, base / "none-verifies")
    jobs["fresh-start"] = pool.submit(_fresh_start_job, reference, base / "fresh-start")
    for name, corrupt in CORRUPTIONS.items():
        jobs[f"corrupt/{name}"] = pool.submit(_corruption_job, reference, base / name, corrupt)
    for target in (DCP_METADATA, RANK0):
        (base / f"pickle{target}").mkdir()
        jobs[f"pickle/{target}"] = pool.submit(
            _pickle_job, reference, base / f"pickle{target}" / "run", target
        )
    for name, overrides in CONFIG_CASES.items():
        jobs[f"config/{name}"] = pool.submit(_config_job, reference, base / f"config-{name}", *overrides)
    return jobs


# ----------------------------------------------------------------------------------------------
# crash at every phase of the save at step 6


def test_reference_run_is_complete(reference):
    assert live_steps(reference) == [10, 9, 6, 3]
    assert quarantined(reference) == []
    for step in (3, 6, 9, 10):
        verify(ckpt(reference, step), checksums=True)
    assert [e["step"] for e in harness.events(reference, "checkpoint_commit")] == [3, 6, 9, 10]


@pytest.mark.parametrize(("point", "mode"), CRASH_CASES, ids=[f"{p}-{m}" for p, m in CRASH_CASES])
def test_crash_during_save_resumes_from_newest_complete(point, mode, independent_runs, reference):
    case: CrashCase = independent_runs[f"crash/{point}/{mode}"].result()
    run = case.run
    # The crashed attempt was SIGKILLed at exactly this point of the step-6 save.
    assert case.crashed.returncode == -signal.SIGKILL, case.crashed.stderr[-3000:]
    assert f"truestep fault: crash at {point} step=6 rank=0" in case.crashed.stderr
    assert case.files_after_crash == {
        6: FILES_AT_CRASH[point],
        3: [DCP_METADATA, MARKER, SHARD, MANIFEST, RANK0],
    }
    assert attempt_events(run, "run_end", 0) == []
    assert [e["step"] for e in attempt_events(run, "checkpoint_commit", 0)] == [3]

    assert case.resumed.returncode == 0, case.resumed.stderr[-3000:]
    assert last_attempt(run) == 1
    complete = 6 if point == "save:after-marker" else 3
    restores = attempt_events(run, "checkpoint_restore", 1)
    assert [(e["step"], Path(e["path"]).name) for e in restores] == [(complete, step_dir_name(complete))]
    events = attempt_events(run, "checkpoint_quarantined", 1)
    if complete == 3:
        # The torn directory was moved aside, unchanged, with the reason in the event log.
        assert [(e["step"], e["reason"]) for e in events] == [(6, "missing COMMITTED")]
        (moved,) = quarantined(run)
        assert moved.name.startswith("step_00000006.") and moved.name.endswith(".missing-committed")
        assert events[0]["moved_to"] == str(moved)
        assert sorted(f.name for f in moved.iterdir()) == FILES_AT_CRASH[point]
    else:
        assert events == [] and quarantined(run) == []
    assert live_steps(run) == [10, 9, 6]  # keep_last_n=3 (default) retired step 3
    for step in (6, 9, 10):
        verify(ckpt(run, step), checksums=True)
    assert_same_trajectory(run, reference, attempt=1, first_step=complete + 1)


# ----------------------------------------------------------------------------------------------
# corruption of the newest committed checkpoint


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupted_newest_checkpoint_is_quarantined_and_resume_falls_back(kind, derived_runs, reference):
    case: CorruptionCase = derived_runs[f"corrupt/{kind}"].result()
    run = case.run
    assert case.proc.returncode == 0, case.proc.stderr[-3000:]
    attempt = last_attempt(run)
    assert attempt == 1
    events = attempt_events(run, "checkpoint_quarantined", attempt)
    assert len(events) == 1, events
    assert events[0]["step"] == 6
    if kind == "bad-marker-json":
        assert events[0]["reason"].startswith(case.reason), events[0]["reason"]
    else:
        assert events[0]["reason"] == case.reason
    # Moved, never deleted nor repaired: the quarantined copy still holds the corruption.
    (moved,) = quarantined(run)
    assert moved.name.startswith("step_00000006.") and events[0]["moved_to"] == str(moved)
    assert file_hashes(moved) == case.corrupted
    assert [e["step"] for e in attempt_events(run, "checkpoint_verified", attempt)] == [3]
    assert [e["step"] for e in attempt_events(run, "checkpoint_restore", attempt)] == [3]
    # The resumed run re-saved step 6 (a fresh, complete directory) and continued bitwise.
    verify(ckpt(run, 6), checksums=True)
    assert_same_trajectory(run, reference, attempt=attempt, first_step=4)


def test_flipped_byte_needs_checksums(reference, tmp_path):
    """The documented trade-off of --checkpoint.verify_checksums=false: sizes are always checked but a
    same-size bit flip is only caught by the SHA-256 pass. (No training on it: that would restore
    silently corrupted weights, which is exactly what the switch accepts.)"""
    d = tmp_path / step_dir_name(6)
    shutil.copytree(ckpt(reference, 6), d)
    size = (d / SHARD).stat().st_size
    _flip_byte(d)
    assert (d / SHARD).stat().st_size == size
    manifest = verify(d, checksums=False)
    assert manifest["files"][SHARD]["size"] == size
    with pytest.raises(VerifyError, match=r"__0_0\.distcp: SHA-256 mismatch"):
        verify(d, checksums=True)


def test_consistently_rewritten_manifest_still_catches_size(reference, tmp_path):
    """An edited size with the marker rewritten to match the edited manifest: the size check fires."""
    d = tmp_path / step_dir_name(6)
    shutil.copytree(ckpt(reference, 6), d)
    manifest = json.loads((d / MANIFEST).read_text())
    real = manifest["files"][SHARD]["size"]
    manifest["files"][SHARD]["size"] = real - 1
    blob = json.dumps(manifest).encode()
    (d / MANIFEST).write_bytes(blob)
    write_marker(d, 6, blob)
    with pytest.raises(VerifyError, match=rf"__0_0\.distcp: size {real} != manifest {real - 1}"):
        verify(d, checksums=False)


def test_planted_file_named_like_the_marker_in_a_subdirectory(reference, tmp_path):
    d = tmp_path / step_dir_name(6)
    shutil.copytree(ckpt(reference, 6), d)
    (d / "sub").mkdir()
    (d / "sub" / MARKER).write_text("{}")
    with pytest.raises(VerifyError, match="files not in the manifest: sub/COMMITTED"):
        verify(d, checksums=True)


def test_malformed_manifest_entry_is_a_verify_error(reference, tmp_path):
    d = tmp_path / step_dir_name(6)
    shutil.copytree(ckpt(reference, 6), d)
    manifest = json.loads((d / MANIFEST).read_text())
    manifest["files"][SHARD] = 12345
    blob = json.dumps(manifest).encode()
    (d / MANIFEST).write_bytes(blob)
    write_marker(d, 6, blob)
    with pytest.raises(VerifyError):
        verify(d, checksums=True)


# ----------------------------------------------------------------------------------------------
# planted pickles


def test_legit_dcp_metadata_loads_safely(reference):
    metadata = safe_load_metadata((ckpt(reference, 6) / DCP_METADATA).read_bytes())
    keys = set(metadata.state_dict_metadata)
    assert "model.tok_embeddings.weight" in keys
    assert any(k.startswith("optim.") for k in keys)
    assert {info.relative_path for info in metadata.storage_data.values()} == {SHARD}


@pytest.mark.parametrize("variant", ["os.system", "builtins.exec", "nested-in-metadata"])
def test_safe_load_metadata_refuses_code(variant, reference, tmp_path):
    marker = tmp_path / "pwned"
    payload_obj = EvilExec(marker) if variant == "builtins.exec" else Evil(marker)
    if variant == "nested-in-metadata":
        # A genuine Metadata object carrying the payload in one of its fields.
        metadata = safe_load_metadata((ckpt(reference, 6) / DCP_METADATA).read_bytes())
        metadata.planner_data = {"x": payload_obj}
        payload = pickle.dumps(metadata)
    else:
        payload = pickle.dumps(payload_obj)
    # The payload is live: a plain unpickle runs it (which is what stock DCP would do).
    pickle.loads(payload)
    assert marker.exists()
    marker.unlink()

    expected = "builtins.exec" if variant == "builtins.exec" else "posix.system"
    with pytest.raises(UnsafeCheckpointError, match=rf"references {expected}; refused"):
        safe_load_metadata(payload)
    assert not marker.exists()


def test_planted_metadata_pickle_is_refused_on_resume(derived_runs):
    case: PickleCase = derived_runs[f"pickle/{DCP_METADATA}"].result()
    assert case.verified_before  # the attacker rewrote manifest and marker: the protocol cannot tell
    assert case.proc.returncode != 0
    assert "checkpoint metadata references posix.system; refused" in case.proc.stderr
    assert not case.marker.exists()
    assert (case.run / "metrics.jsonl").read_bytes() == case.metrics_before
    assert attempt_events(case.run, "run_start", 1) == []


def test_planted_rank_state_pickle_is_refused_as_non_json(derived_runs):
    case: PickleCase = derived_runs[f"pickle/{RANK0}"].result()
    assert case.verified_before
    assert case.proc.returncode != 0
    assert "rank00000.json is not valid JSON" in case.proc.stderr
    assert not case.marker.exists()
    assert (case.run / "metrics.jsonl").read_bytes() == case.metrics_before
    assert attempt_events(case.run, "run_start", 1) == []


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
    trainer = SimpleNamespace(cfg=cfg, ctx=DistContext(), logs=logs, run_dir=tmp_path)
    checkpointer = Checkpointer(trainer)  # type: ignore[arg-type]
    root = checkpointer.root
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
    trajectory from step 7 on."""
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
    got, want = harness.loss_bits_by_step(case.run), harness.loss_bits_by_step(reference_future.result())
    assert all(got[s] == want[s] for s in range(1, 7))
    assert [s for s in range(7, max(want) + 1) if got[s] != want[s]][:1] == [7]
