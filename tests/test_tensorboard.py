"""`metrics.tensorboard = true`: the event files hold the same per-step scalars as metrics.jsonl.

Read back with TensorBoard's own EventAccumulator. TensorBoard stores scalars as float32, so each value
is compared with the float32 rounding of the metrics.jsonl value (exact equality, not a tolerance).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness import launch, metrics

pytestmark = pytest.mark.multiprocess

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="tensorboard is not installed (pip install 'truestep[dev]' or pip install tensorboard)",
)

KEYS = ("loss", "grad_norm", "lr", "tokens_seen", "step_time", "peak_mem_bytes")
COMMON = ["--metrics.tensorboard=true", "--schedule.warmup_steps=2"]


def tb_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard shows it, every event kept (size_guidance 0 = no sampling):
    the event files (one per attempt) in the order they were begun (their first event's wall time: the
    time in a file's name is only to the second), a later file's steps replacing the earlier ones' from
    its first step on (the resumed writer's purge_step)."""
    files = []
    for path in (run_dir / "tb").glob("events.out.tfevents.*"):
        acc = event_accumulator.EventAccumulator(str(path), size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        files.append((acc.FirstEventTimestamp(), acc))
    merged: dict[str, list[tuple[int, float]]] = {}
    for _, acc in sorted(files, key=lambda f: f[0]):
        for tag in acc.Tags()["scalars"]:
            events = [(e.step, e.value) for e in acc.Scalars(tag)]
            if events:
                merged[tag] = [(s, v) for s, v in merged.get(tag, []) if s < events[0][0]] + events
    return merged


def last_per_step(run_dir: Path) -> dict[int, dict]:
    """metrics.jsonl by step; a step logged twice (recomputed after a crash) keeps the last."""
    return {m["step"]: m for m in metrics(run_dir)}


def assert_matches(
    run_dir: Path, steps: list[int], self_check: list[tuple[int, float]] | None = None
) -> None:
    """The train/ scalars match metrics.jsonl; `resume/self_check` (a resumed run's self-check, 1 =
    verified) holds exactly `self_check`, or is absent when None."""
    scalars = tb_scalars(run_dir)
    assert scalars.pop("resume/self_check", None) == self_check
    assert sorted(scalars) == sorted(f"train/{k}" for k in KEYS)
    expected = last_per_step(run_dir)
    assert sorted(expected) == steps
    for key in KEYS:
        got = scalars[f"train/{key}"]
        assert [s for s, _ in got] == steps, (key, [s for s, _ in got])
        for step, value in got:
            want = np.float32(expected[step][key])
            assert np.float32(value) == want, (key, step, value, want)


def test_tensorboard_scalars_match_metrics_jsonl(tmp_path: Path) -> None:
    launch(tmp_path, *COMMON, "--train.max_steps=6", "--checkpoint.interval=0")
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert_matches(tmp_path, list(range(1, 7)))
    assert metrics(tmp_path)[-1]["loss"] != metrics(tmp_path)[0]["loss"]  # real, changing values


def test_tensorboard_across_a_graceful_stop_and_resume(tmp_path: Path) -> None:
    """A planned stop (closes the writer) and a resume in the same run directory: one point per step."""
    launch(tmp_path, *COMMON, "--train.max_steps=6", "--train.stop_at_step=3")
    launch(tmp_path, *COMMON, "--train.max_steps=6")
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2
    assert_matches(tmp_path, list(range(1, 7)), self_check=[(4, 1.0)])  # judged by the stop witness


def test_tensorboard_after_a_crash_and_resume(tmp_path: Path) -> None:
    """SIGKILL as step 6 starts (checkpoint at 3): steps 4-5 are recomputed by the restart.

    What TensorBoard should show is what metrics.jsonl shows: each step 1..8 once, with the values of
    the attempt that the trajectory kept.
    """
    common = [*COMMON, "--train.max_steps=8", "--checkpoint.interval=3", "--checkpoint.async_save=false"]
    crashed = launch(tmp_path, *common, "--fault", "kill:step=6", check=False)
    assert crashed.returncode != 0
    launch(tmp_path, *common)
    assert sorted(last_per_step(tmp_path)) == list(range(1, 9))
    assert_matches(tmp_path, list(range(1, 9)), self_check=[(5, 1.0)])  # steps 4-5 replayed bitwise
