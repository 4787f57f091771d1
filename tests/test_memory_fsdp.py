"""Recovery stays bitwise with the memory options on, under FSDP2 with real gloo process groups: bf16
mixed precision on CPU (parallel.mixed_precision_cpu) and full activation checkpointing, stopped and
resumed, reproduce every loss bit, every held-out evaluation (eval.*) and the final parameters of the
same job run without a stop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from harness import LAYOUT_REFERENCE, bits, events, final_digest, launch, loss_bits_by_step, metrics
from truestep.data import prepare_data

pytestmark = pytest.mark.multiprocess

OPTIONS = ["--parallel.mixed_precision_cpu=true", "--train.activation_checkpointing=full"]


def test_bf16_and_checkpointing_resume_bit_for_bit_under_fsdp(
    layout_reference: Callable[[str], Path], tmp_path: Path
) -> None:
    text = tmp_path / "held_out.txt"
    text.write_text("".join(f"held-out line {i}: {i * 7919 % 1000}\n" for i in range(300)))
    prepare_data([text], tmp_path / "held_out", tokenizer_spec="byte")
    options = [*OPTIONS, "--eval.every_steps=3", f"--eval.path={tmp_path / 'held_out'}", "--eval.samples=4"]
    fresh, resumed = tmp_path / "fresh", tmp_path / "resumed"
    launch(fresh, *LAYOUT_REFERENCE, *options, nproc=2)
    launch(resumed, *LAYOUT_REFERENCE, *options, "--train.stop_at_step=4", nproc=2)
    launch(resumed, *LAYOUT_REFERENCE, *options, nproc=2)
    assert events(resumed, "checkpoint_restore")[-1]["step"] == 4
    assert loss_bits_by_step(resumed) == loss_bits_by_step(fresh)
    evals = {run: {e["step"]: bits(e["loss"]) for e in events(run, "eval")} for run in (fresh, resumed)}
    assert sorted(evals[fresh]) == [3, 6] and evals[resumed] == evals[fresh]  # step 6: after the resume
    assert final_digest(resumed) == final_digest(fresh)
    # bf16 did compute: the same job in fp32 (the fsdp2 reference) follows another trajectory.
    fp32 = loss_bits_by_step(layout_reference("fsdp2"))
    assert loss_bits_by_step(fresh)[1] != fp32[1]
    first, last = metrics(fresh)[0], metrics(fresh)[-1]
    assert last["loss"] < first["loss"] - 0.3, "bf16 training still learns"
    assert all(len(e["peak_mem_bytes_per_rank"]) == 2 for e in events(resumed, "run_end"))
