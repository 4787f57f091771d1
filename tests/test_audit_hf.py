"""`truestep audit` against Hugging Face Trainer (tests/audit_trainers/hf_trainer_script.py: a tiny MLP
with dropout, TensorBoard logs, a checkpoint every 4 steps, resumed with `resume_from_checkpoint`): a
correct resume is judged bitwise, and two real misconfigurations are caught: `ignore_data_skip=True`
(the resumed run trains again on batches the first attempt consumed) and an optimizer state that is not
restored (optimizer.pt missing from the checkpoint: Trainer silently starts a fresh AdamW).

The reference and floor are made once for the module; each test adds one faulted run (kill at step 6,
the newest checkpoint is step 4)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from audit_cases import audit_cases, command, failure_free, make_plan, needs, restored_at
from truestep.analysis.verdict import Status
from truestep.audit.plan import AuditPlan
from truestep.audit.readers import read_hf, read_tensorboard
from truestep.audit.spec import DEFAULT_TAGS

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("offline"), needs("accelerate")]


CASES = {
    "correct": (["kill@step=6"], ""),
    "ignore-data-skip": (["kill@step=6"], "--ignore-data-skip"),
    "drop-optimizer": (["kill@step=6"], "--drop-optimizer-state"),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, offline: None) -> tuple[Path, AuditPlan]:
    # One floor repeat: this trainer is bitwise repeatable on CPU, and a zero floor needs no second one
    # (the default of two: tests/test_audit_toy.py).
    plan = make_plan(
        command("hf_trainer_script.py"), "tensorboard:tb", weights="final/model.safetensors", repeats=1
    )
    return failure_free(tmp_path_factory.mktemp("hf") / "base", plan), plan


@pytest.fixture(scope="module")
def judged(base, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return audit_cases(*base[:1], tmp_path_factory.mktemp("hf-faulted"), base[1], CASES)


def test_a_correct_trainer_resume_is_bitwise(judged) -> None:
    summary, run = judged["correct"]
    assert run.verdict.status is Status.BITWISE, run.verdict.label
    assert summary.verdict.exit_code == 0 and restored_at(run) in ([4], [8])
    assert run.verdict.evidence is not None and run.verdict.evidence.final_parameters
    # The killed attempt's steps past the checkpoint, recomputed, each next to its pre-fault line.
    (resumed,) = restored_at(run)
    assert run.verdict.evidence.replays == run.incidents[0].pre_fault_step - resumed


def test_ignore_data_skip_is_caught(judged) -> None:
    """The resumed run trains its first step on the epoch's first batch again: its loss differs."""
    summary, run = judged["ignore-data-skip"]
    assert run.verdict.status is Status.VIOLATED and summary.verdict.exit_code == 1
    (resumed,) = restored_at(run)
    assert run.verdict.violation is not None and run.verdict.violation.step == resumed + 1
    assert run.verdict.violation.observable == "loss"


def test_an_optimizer_state_not_restored_is_caught(judged) -> None:
    """Without optimizer.pt Trainer loads neither the optimizer nor the scheduler: the first resumed
    step already runs at the schedule's initial learning rate, and then a fresh AdamW."""
    summary, run = judged["drop-optimizer"]
    assert run.verdict.status is Status.VIOLATED and summary.verdict.exit_code == 1
    (resumed,) = restored_at(run)
    assert run.verdict.violation is not None and run.verdict.violation.step == resumed + 1


def test_trainer_state_and_tensorboard_say_the_same(base) -> None:
    """The hf: reader on the reference's own trainer_state.json (the newest checkpoint's) agrees with
    its TensorBoard events: the same steps, the same values at TensorBoard's float32."""
    job = base[0] / "runs" / "reference" / "job"
    tb = read_tensorboard(job / "tb", DEFAULT_TAGS["tensorboard"])
    state = read_hf(job / "out", DEFAULT_TAGS["hf"])
    assert not tb.problems and not state.problems
    f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]  # noqa: E731
    assert [r.step for r in state.records] == [r.step for r in tb.records] == list(range(1, 13))
    for a, b in zip(state.records, tb.records, strict=True):
        assert {k: f32(v) for k, v in a.values} == b.observed
