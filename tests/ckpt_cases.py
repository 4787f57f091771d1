"""Shared helpers and job functions for the checkpoint-integrity tests (tests/test_checkpoint_*.py).

Real `truestep train` processes (tests/harness.py) on the tiny model. Startup dominates a run, so the
runs are submitted to a small thread pool (TRUESTEP_TEST_JOBS, default min(4, cpus)) from session-scoped
fixtures in tests/conftest.py and shared: one uninterrupted reference run, then independent crash/resume
pairs, then destructive cases that each work on their own `shutil.copytree` of the reference run
directory. Tests only wait for their own job.

Trajectory claims are bitwise: fp32 loss bit patterns per step (`harness.loss_bits_by_step`) and the
final parameter digest (`harness.final_digest`) must equal the reference run's.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import harness
from truestep.checkpoint.catalog import (
    DCP_METADATA,
    MANIFEST,
    MARKER,
    QUARANTINE,
    SAVE_RECORD,
    manifest_shard_name,
    rank_state_name,
    step_dir_name,
    step_dirs,
    step_of,
)
from truestep.checkpoint.integrity import verify
from truestep.checkpoint.manifest import VerifyError, write_manifest, write_marker
from truestep.core.names import ENV_FAULTS as FAULTS_ENV

# The reference trajectory: 10 steps, a checkpoint every 3 (3, 6, 9) plus the final one (10).
# keep_last_n is not a trajectory key; 0 keeps every checkpoint so copies can start from any of them.
RUN = ("--train.max_steps=10", "--checkpoint.interval=3")
REFERENCE = (*RUN, "--checkpoint.keep_last_n=0")
MAX_STEPS = 10
SHARD = "__0_0.distcp"  # DCP's name for rank 0's first storage file
RANK0 = rank_state_name(0)
MANIFEST_SHARD0 = manifest_shard_name(0)
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
# run jobs


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
# What the step-6 directory holds when the process dies at each point, in the order the save writes them:
# rank state before DCP starts; DCP's shard, then this rank's manifest shard once its items are written
# (after save:mid-shards), then the coordinator's .metadata; rank 0's save record once the ranks agreed
# on the parameter digest (after the write started); then manifest and marker. Names from the catalog,
# sorted as the test lists a directory.
_WRITTEN = [DCP_METADATA, SHARD, RANK0, MANIFEST_SHARD0, SAVE_RECORD]
FILES_AT_CRASH = {
    "save:before-shards": [],
    "save:mid-shards": sorted([SHARD, RANK0]),
    "save:after-shards": sorted(_WRITTEN),
    "save:before-manifest": sorted(_WRITTEN),
    "save:before-marker": sorted([*_WRITTEN, MANIFEST]),
    "save:after-marker": sorted([*_WRITTEN, MANIFEST, MARKER]),
}
# An async save's shards are written on DCP's thread while the training thread writes the save record:
# a crash mid-shards may come before or after the record (an uncommitted directory either way). In a
# sync save the write, crash included, comes first.
RACING_AT_CRASH = {("save:mid-shards", "async"): {SAVE_RECORD}}
COMMITTED_FILES = FILES_AT_CRASH["save:after-marker"]
"""A committed checkpoint of the one-rank tiny run."""


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


# --- destructive cases on copies of the reference run


# --- destructive cases on copies of the reference run


def _truncate(d: Path) -> str:
    data = (d / SHARD).read_bytes()
    (d / SHARD).write_bytes(data[: len(data) // 2])
    return f"{SHARD}: size {len(data) // 2} != manifest {len(data)} (truncated?)"


def _flip_byte(d: Path) -> str:
    data = bytearray((d / SHARD).read_bytes())
    data[len(data) // 2] ^= 0x40
    (d / SHARD).write_bytes(bytes(data))
    # Found by the rank that reads the item, while loading it (the reason continues with the range).
    return f"failed to load: {SHARD}: SHA-256 mismatch (corrupted) in bytes "


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
