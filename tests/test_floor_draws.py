"""Issue 38, item 3: floors are independent draws, judged on every observable. On three real runs under
emulated GPU noise (in-process, the tiny model) and hand-made ones: a repeat that shares history with
the reference is no draw, a repeat with a non-finite lr is refused, and no family's threshold becomes
infinite because one repeat is too close."""

from __future__ import annotations

import json
import math
import shutil
import uuid
from pathlib import Path

import pytest

from analysis_cases import clean, loss_of
from harness import INPROCESS_JOB, run_in_process
from truestep.analysis.floor import DIGEST, measure_floor
from truestep.analysis.runlog import RunLog, RunLogError

NOISE = "--train.emulate_nondeterminism=1e-2"


@pytest.fixture(scope="module")
def noisy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("draws")
    for name in ("ref", "f1", "f2"):
        assert run_in_process(base / name, *INPROCESS_JOB, NOISE) == 0
    return {name: base / name for name in ("ref", "f1", "f2")}


def another_run(src: Path, dest: Path, metrics=None) -> RunLog:
    """A copy of `src` given its own identity (run id, start times), its metrics lines edited: what a
    near-copy made by hand looks like to the instrument."""
    shutil.copytree(src, dest)
    run_id = uuid.uuid4().hex
    lease = json.loads((dest / "lease.json").read_text())
    (dest / "lease.json").write_text(json.dumps({**lease, "run_id": run_id}))
    events = [json.loads(x) for x in (dest / "events.jsonl").read_text().splitlines()]
    for e in events:
        e["time"] += 1e3
        if e["event"] == "run_start":
            e.update(run_id=run_id, process_start=e["process_start"] + 1e3)
    (dest / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    lines = [json.loads(x) for x in (dest / "metrics.jsonl").read_text().splitlines()]
    lines = metrics(lines) if metrics else lines
    (dest / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return RunLog.load(dest)


def test_a_near_copy_of_the_reference_is_no_draw(noisy, tmp_path: Path) -> None:
    """The audit: a repeat bit-identical to the reference at the checkpoints (a near-copy, or a repeat
    whose first steps are the reference's) made tau infinite for parameters and both AdamW moments. Here
    the reference's own run with its last two losses nudged: it shares the reference's history, so it is
    no draw, and the floor is exactly the floor of the two real repeats."""
    ref = RunLog.load(noisy["ref"])
    near = another_run(
        noisy["ref"],
        tmp_path / "near",
        lambda ms: [{**m, "loss": m["loss"] + 1e-6} if m["step"] > 6 else m for m in ms],
    )
    repeats = [RunLog.load(noisy["f1"]), RunLog.load(noisy["f2"])]
    floor = measure_floor(ref, [near, *repeats])
    assert floor.repeats == [str(r.path) for r in repeats]  # the floor of the two real repeats
    assert any(f"{near.path} is bit-identical to the reference until step 7" in n for n in floor.notes)
    assert floor.state_steps == [4, 8] and all(
        floor.families[k].envelope.values for k in ("params", "exp_avg")
    )
    assert all(math.isfinite(fam.tau) for f, fam in floor.families.items() if f != DIGEST)
    # With one real repeat beside it, the floor is insufficient: nothing is judged, never a pass.
    assert measure_floor(ref, [near, repeats[0]], read_state=False).insufficient


def test_a_floor_repeat_with_a_non_finite_lr_is_refused(noisy, tmp_path: Path) -> None:
    """The audit: NaN lr in a floor repeat was accepted (only loss and grad norm were checked): the lr
    envelope became infinite and lr x1.5 after a resume passed."""
    bad = another_run(
        noisy["f1"], tmp_path / "bad", lambda ms: [{**m, "lr": math.nan} if m["step"] == 5 else m for m in ms]
    )
    with pytest.raises(RunLogError, match="non-finite observable at step 5 \\(lr\\)"):
        measure_floor(RunLog.load(noisy["ref"]), [bad, RunLog.load(noisy["f2"])])


def test_a_repeat_whose_first_steps_are_the_references_is_no_draw(tmp_path: Path) -> None:
    """Hand-made: the repeats part from the reference at step 1, one repeat only at step 7 (its first six
    steps are the reference's): beyond the envelope's look-ahead, so it shares that history."""
    ref = clean(tmp_path / "ref")
    a = clean(tmp_path / "a", loss=lambda s: loss_of(s) + 1e-4 * s, digest="a")
    b = clean(tmp_path / "b", loss=lambda s: loss_of(s) - 2e-4 * s, digest="b")
    late = clean(tmp_path / "late", loss=lambda s: loss_of(s) + (3e-4 if s >= 7 else 0.0), digest="l")
    floor = measure_floor(ref, [a, late, b])
    assert floor.repeats == [str(a.path), str(b.path)]
    assert "bit-identical to the reference until step 7" in floor.notes[0]


def test_no_threshold_is_infinite_when_one_repeat_is_too_close(tmp_path: Path) -> None:
    """Hand-made: both repeats differ from the reference from step 1 on (independent draws), but one
    logs the reference's grad norm bit for bit. Its grad-norm envelope is zero, so the other repeat's
    leave-one-out statistic was v/0 = inf and with it tau. Every family now has a resolution floor (one
    fp32 ulp of the reference's value), so tau is finite."""
    ref = clean(tmp_path / "ref")
    a = clean(
        tmp_path / "a",
        loss=lambda s: loss_of(s) + 1e-4 * s,
        grad=lambda s: 1 + s * 0.01 + 1e-5 * s,
        digest="a",
    )
    b = clean(tmp_path / "b", loss=lambda s: loss_of(s) - 1e-4 * s, digest="b")
    floor = measure_floor(ref, [a, b])
    assert floor.k == 2 and not floor.notes
    grad = floor.families["grad_norm"]
    assert all(math.isfinite(x) for x in grad.loo) and math.isfinite(grad.tau)
    assert all(math.isfinite(fam.tau) for f, fam in floor.families.items() if f != DIGEST)
