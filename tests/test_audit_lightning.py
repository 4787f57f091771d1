"""`truestep audit` against PyTorch Lightning (tests/audit_trainers/lightning_script.py: a tiny MLP with
dropout, a shuffled loader, `last.ckpt` at every epoch's end, resumed with `ckpt_path="last"`, a JSON
lines log): a resume whose RNG streams are restored is judged bitwise; Lightning's default, which does
not checkpoint them, is caught (the resumed epoch draws another shuffle and other dropout masks)."""

from __future__ import annotations

import pytest

from audit_cases import audit_cases, command, failure_free, make_plan, needs, restored_at
from truestep.analysis.verdict import Status

pytestmark = [pytest.mark.multiprocess, needs("pytorch_lightning")]

CASES = {"correct": (["kill@step=6"], ""), "no-rng-restore": (["kill@step=6"], "--no-rng-restore")}


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> dict:
    # One floor repeat: bitwise repeatable on CPU (the default of two: tests/test_audit_toy.py).
    plan = make_plan(
        command("lightning_script.py"), "jsonl:log.jsonl", weights="final.safetensors", repeats=1
    )
    base = failure_free(tmp_path_factory.mktemp("lightning") / "base", plan)
    return audit_cases(base, tmp_path_factory.mktemp("lightning-faulted"), plan, CASES)


def test_a_resume_with_its_rng_restored_is_bitwise(judged) -> None:
    summary, run = judged["correct"]
    assert run.verdict.status is Status.BITWISE, run.verdict.label
    assert summary.verdict.exit_code == 0 and restored_at(run) in ([4], [8])
    assert run.verdict.evidence is not None and run.verdict.evidence.final_parameters


def test_lightnings_default_resume_without_rng_state_is_caught(judged) -> None:
    summary, run = judged["no-rng-restore"]
    assert run.verdict.status is Status.VIOLATED and summary.verdict.exit_code == 1
    (resumed,) = restored_at(run)
    assert run.verdict.violation is not None and run.verdict.violation.step == resumed + 1
