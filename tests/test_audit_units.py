"""`truestep audit`'s parts without a process: its arguments, the log readers on real writers' files and
hostile ones, the weights digest, what a job's record becomes as a run directory, and the analysis's
generalizations it relies on (declared gaps, declared precision, runs without a parameter digest)."""

from __future__ import annotations

import itertools
import json
import os
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from truestep.analysis.runlog import RunLog
from truestep.analysis.summary import analyze_group
from truestep.analysis.verdict import Status
from truestep.audit.job import Attempt, Fired, JobRecord, JobSpec, Seen
from truestep.audit.readers import Record, read_hf, read_jsonl, read_tensorboard
from truestep.audit.rundir import logged_precision, write
from truestep.audit.spec import DEFAULT_TAGS, parse_fault, parse_logs, resolve_in
from truestep.audit.tfevents import read_scalars
from truestep.audit.weights import WeightsFileError, weights_digest
from truestep.cli.main import main
from truestep.core.errors import UsageError

TB, HF, JSONL = DEFAULT_TAGS["tensorboard"], DEFAULT_TAGS["hf"], DEFAULT_TAGS["jsonl"]


# ---------------------------------------------------------------------------------------------- arguments


def test_arguments_are_checked(tmp_path: Path) -> None:
    assert parse_logs("tensorboard:tb").where(tmp_path) == tmp_path / "tb"
    assert resolve_in("{run_dir}/x/y", tmp_path) == tmp_path / "x" / "y"
    assert parse_logs("jsonl:l.jsonl", "loss=train_loss,step=it").tags["step"] == "it"
    assert parse_fault("term@time=2.5").text == "term@time=2.5" and parse_fault("kill@step=7").value == 7
    for bad in ("csv:x", "hf", "tensorboard:/abs/path", "jsonl:"):
        with pytest.raises(UsageError):
            parse_logs(bad)
    for bad in ("kill@step=0", "kill@step=2.5", "crash@step=3", "kill:step=3"):
        with pytest.raises(UsageError):
            parse_fault(bad)
    with pytest.raises(UsageError):
        parse_logs("hf:x", "step=s")  # step is a jsonl key only


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--out", "o", "--logs", "hf:x", "--fault", "kill@step=3"], "no command to audit"),
        (["--out", "o", "--logs", "hf:x", "--", "python", "t.py"], "nothing to measure"),
        (
            ["--out", "o", "--logs", "hf:x", "--fault", "kill@step=3", "--repeats", "1", "--", "t"],
            "--repeats",
        ),
        (["--out", "o", "--logs", "hf:x", "--fault", "boom", "--", "t"], "--fault 'boom'"),
        (
            ["--out", "o", "--logs", "hf:x", "--fault", "kill@step=3", "--weights", "/w.pt", "--", "t"],
            "{run_dir}",
        ),
        (["--out", "o", "--logs", "hf:x", "--fault", "kill@step=3", "--", "no-such-trainer"], "cannot start"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv: list[str], says: str, capsys, tmp_path: Path) -> None:
    argv = [str(tmp_path / "o") if a == "o" else a for a in argv]
    assert main(["audit", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and err[0].startswith("truestep audit: ")


# ---------------------------------------------------------------------------------------------- readers


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


@pytest.fixture(scope="module")
def tb_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real SummaryWriter's file: old-style (simple_value) and new-style (tensor) scalars, other tags."""
    from torch.utils.tensorboard import SummaryWriter

    root = tmp_path_factory.mktemp("tb")
    writer = SummaryWriter(str(root))
    for step in range(1, 6):
        writer.add_scalar("train/loss", 1.0 / step, step)
        writer.add_scalar("train/grad_norm", 0.1 * step, step, new_style=True)
        writer.add_scalar("train/epoch", 0.5, step)
    writer.close()
    (path,) = root.glob("events.out.tfevents.*")
    return path


def test_tensorboard_scalars_as_the_writer_wrote_them(tb_file: Path) -> None:
    read = read_tensorboard(tb_file.parent, TB)
    assert not read.problems and [r.step for r in read.records] == [1, 2, 3, 4, 5]
    assert [r.observed for r in read.records] == [
        {"loss": f32(1.0 / s), "grad_norm": f32(0.1 * s)} for s in range(1, 6)
    ]
    assert all(r.time is not None for r in read.records)


def test_a_torn_or_garbled_event_file_never_raises(tb_file: Path) -> None:
    data = tb_file.read_bytes()
    whole, _, _ = read_scalars(data)
    for cut in range(len(data)):
        scalars, _, _ = read_scalars(data[:cut])
        assert scalars == whole[: len(scalars)]  # a prefix, never an invented value
    for junk in (
        os.urandom(4096),
        struct.pack("<Q", 1 << 60) + bytes(64),
        data[:40] + os.urandom(200) + data,
    ):
        read_scalars(junk)  # returns, whatever it finds


def test_a_fifo_or_symlink_among_event_files_is_counted_not_followed(tb_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "tb"
    root.mkdir()
    os.mkfifo(root / "events.out.tfevents.1.fifo")
    (root / "events.out.tfevents.2.link").symlink_to(tb_file)
    (root / "events.out.tfevents.3.real").write_bytes(tb_file.read_bytes())
    read = read_tensorboard(root, TB)
    assert len(read.records) == 5 and len(read.problems) == 2


def test_trainer_state_the_newest_checkpoint_and_a_torn_one(tmp_path: Path) -> None:
    def state(step: int) -> str:
        history = [
            {"loss": 1.0 + s, "grad_norm": 0.5, "learning_rate": 0.1, "step": s} for s in range(1, step + 1)
        ]
        return json.dumps({"global_step": step, "log_history": [*history, {"train_loss": 2.0, "step": step}]})

    for step in (4, 8):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(state(step))
    (tmp_path / "checkpoint-12").mkdir()
    (tmp_path / "checkpoint-12" / "trainer_state.json").write_text(state(12)[:100])  # being rewritten
    read = read_hf(tmp_path, HF)
    assert [r.step for r in read.records] == list(range(1, 9)) and len(read.problems) == 1
    assert read.records[0].observed == {"loss": 2.0, "grad_norm": 0.5, "lr": 0.1}


def test_json_lines_torn_last_line_and_a_corrupt_one(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0, "grad_norm": 2.0, "time": 5.0}) for s in (1, 2)]
    path.write_text(lines[0] + "\n{not json\n" + lines[1] + "\n" + '{"step": 3, "lo')
    read = read_jsonl(path, JSONL)
    assert [r.step for r in read.records] == [1, 2] and read.records[0].time == 5.0
    assert read.problems == [f"{path}: 1 line(s) are not JSON"]


def test_a_rounded_observable_is_recognised() -> None:
    def seen(values: list[float]) -> list[Seen]:
        return [Seen(Record(i, (("loss", v), ("grad_norm", v / 3))), 0.0) for i, v in enumerate(values)]

    assert logged_precision(seen([2.3456, 1.2, 0.9871, 3.5, 1.0001])) == {"loss": 1e-4}
    assert logged_precision(seen([f32(2.3456), f32(1.2), f32(0.9871), f32(3.5)])) == {"loss": 1e-4}
    assert logged_precision(seen([2.345678912, 1.2, 0.9871, 3.5])) == {}
    assert logged_precision(seen([2.3456, 1.2, 0.9871])) == {}  # too few values to tell


# ---------------------------------------------------------------------------------------------- weights


def test_safetensors_digest_is_of_the_tensors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(4, dtype=torch.bfloat16)}
    save_file(tensors, str(tmp_path / "x.safetensors"), metadata={"run": "one"})
    save_file(dict(reversed(tensors.items())), str(tmp_path / "y.safetensors"), metadata={"run": "two"})
    changed = dict(tensors, b=tensors["b"].clone())
    changed["b"].view(torch.int32)[0, 0] ^= 1  # one bit
    save_file(changed, str(tmp_path / "z.safetensors"))
    digest = weights_digest(tmp_path / "x.safetensors")
    assert digest == weights_digest(tmp_path / "y.safetensors") != weights_digest(tmp_path / "z.safetensors")


def test_torch_file_digest_ignores_the_file_name_and_refuses_what_torch_never_writes(tmp_path: Path) -> None:
    sd = {"w": torch.arange(5.0)}
    torch.save(sd, tmp_path / "one.pt")
    torch.save(sd, tmp_path / "two.bin")
    torch.save({"w": torch.arange(5.0) + 1}, tmp_path / "three.pt")
    assert weights_digest(tmp_path / "one.pt") == weights_digest(tmp_path / "two.bin")
    assert weights_digest(tmp_path / "one.pt") != weights_digest(tmp_path / "three.pt")
    with zipfile.ZipFile(tmp_path / "bomb.pt", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("bomb/data.pkl", bytes(1 << 20))
    (tmp_path / "junk.pt").write_bytes(os.urandom(64))
    os.mkfifo(tmp_path / "fifo.pt")
    for bad in ("bomb.pt", "junk.pt", "fifo.pt", "absent.pt"):
        with pytest.raises(WeightsFileError):
            weights_digest(tmp_path / bad)


# ---------------------------------------------------------------------------------------------- run dirs


JOB_STARTS = itertools.count()


def job(
    tmp: Path,
    name: str,
    attempts: list[list[tuple[int, float]]],
    faults: list[str] = (),
    digest: str | None = "d",
) -> JobRecord:  # type: ignore[assignment]
    """A job's record as job.py leaves it: attempt k's (step, loss) records, one second per attempt; each
    job starts at its own time (jobs that started at the same instants would be one run copied)."""
    spec = JobSpec(name, "faulted" if faults else "reference", ["train", "{run_dir}"], parse_logs("jsonl:l"),
                   [parse_fault(f) for f in faults], "w" if digest else None)  # fmt: skip
    began = 100.0 + 1000.0 * next(JOB_STARTS)
    record = JobRecord(spec, tmp / name / "job", began, digest=digest)
    for k, steps in enumerate(attempts):
        start = began + 10 * k
        a = Attempt(
            k,
            ["train"],
            start,
            exit_code=0 if k == len(attempts) - 1 else -9,
            exited=start + 9,
            down=start + 9.5,
        )
        a.records = [
            Seen(Record(s, (("loss", v), ("grad_norm", 1.0))), start + 1 + 0.5 * i)
            for i, (s, v) in enumerate(steps)
        ]
        record.attempts.append(a)
        if k < len(attempts) - 1:
            record.fired.append(Fired(spec.faults[k], k, start + 8, steps[-1][0] if steps else None))
    (tmp / name).mkdir(parents=True)
    write(record, tmp / name)
    return record


STEPS = [(s, 1.0 / s) for s in range(1, 9)]


def judge(tmp: Path, faulted: JobRecord) -> object:
    logs = {n: RunLog.load(tmp / n) for n in ("reference", "floor-1", "floor-2", faulted.spec.name)}
    group = analyze_group("reference", logs["reference"], {f: logs[f] for f in ("floor-1", "floor-2")},
                          {"faulted": ("faulted", logs[faulted.spec.name])}, [], read_state=False)  # fmt: skip
    return group.runs["faulted"].verdict


@pytest.fixture
def failure_free(tmp_path: Path) -> Path:
    for name in ("reference", "floor-1", "floor-2"):
        job(tmp_path, name, [STEPS])
    return tmp_path


def test_a_resume_seen_in_the_logs_is_judged(failure_free: Path) -> None:
    run = job(failure_free, "faulted", [STEPS[:6], STEPS[4:]], ["kill@step=6"])
    verdict = judge(failure_free, run)
    assert verdict.status is Status.BITWISE and verdict.evidence.replays == 2
    restore = [e for e in RunLog.load(failure_free / "faulted").named("checkpoint_restore")]
    assert [(e["step"], e["inferred"], e["restore_s"]) for e in restore] == [(4, True, 0.0)]


def test_a_restart_from_the_first_step_is_a_gap_even_when_bitwise(failure_free: Path) -> None:
    verdict = judge(failure_free, job(failure_free, "faulted", [STEPS[:6], STEPS], ["kill@step=6"]))
    assert verdict.status is Status.INCOMPLETE
    # One cause, one gap: the scenario rule owns "did not resume" and says how the restart began.
    texts = [g.text for g in verdict.gaps if "resume" in g.text]
    assert len(texts) == 1 and texts[0].startswith("the run never resumed from a checkpoint"), verdict.gaps
    assert "attempt 1 started at step 0" in texts[0]


def test_a_restart_that_logs_nothing_is_no_resume(failure_free: Path) -> None:
    verdict = judge(failure_free, job(failure_free, "faulted", [STEPS, []], ["kill@step=8"]))
    assert verdict.status is Status.INCOMPLETE
    texts = [g.text for g in verdict.gaps if "resume" in g.text]
    assert len(texts) == 1 and "attempt 1 logged no step" in texts[0], verdict.gaps


def test_a_fault_before_the_first_step_exercised_no_resume(failure_free: Path) -> None:
    verdict = judge(failure_free, job(failure_free, "faulted", [[], STEPS], ["kill@time=0.1"]))
    assert verdict.status is Status.INCOMPLETE
    assert verdict.gaps[0].what == "the fault came before the first logged step"


def test_a_wrong_step_after_the_resume_is_violated(failure_free: Path) -> None:
    wrong = STEPS[4:6] + [(7, 0.5)] + STEPS[7:]
    verdict = judge(failure_free, job(failure_free, "faulted", [STEPS[:6], wrong], ["kill@step=6"]))
    assert verdict.status is Status.VIOLATED and verdict.violation.step == 7


def test_without_weights_the_reference_serves_and_the_final_parameters_are_a_gap(tmp_path: Path) -> None:
    for name in ("reference", "floor-1", "floor-2"):
        job(tmp_path, name, [STEPS], digest=None)
    verdict = judge(tmp_path, job(tmp_path, "faulted", [STEPS[:6], STEPS[4:]], ["kill@step=6"], digest=None))
    assert verdict.status is Status.INCOMPLETE
    assert [g.what for g in verdict.gaps] == ["final parameters not compared at step"]
    assert "lr" not in RunLog.load(tmp_path / "faulted").metrics[0]  # lr is not required of a line


def test_a_rounded_loss_is_declared_and_the_report_says_so(tmp_path: Path) -> None:
    from truestep.analysis.floor import measure_floor
    from truestep.analysis.report.sections import floor_blocks

    rounded = [(s, round(1.0 / s, 4)) for s in range(1, 9)]
    for name in ("reference", "floor-1"):
        job(tmp_path, name, [rounded])
    ref = RunLog.load(tmp_path / "reference")
    assert ref.precision() == {"loss": 1e-4}
    floor = measure_floor(ref, [RunLog.load(tmp_path / "floor-1")], read_state=False)
    table = floor_blocks(floor)[0]
    assert ["logged precision", floor.precision[0]] in [list(row) for row in table.rows]
    assert floor.precision[0].startswith("loss was logged rounded to 0.0001")


def test_a_step_read_while_it_was_written_is_no_gap_once_read_whole(tmp_path: Path) -> None:
    """A poll can find a step with one tag flushed and not the next (seen under load in CI): the whole
    record a later poll reads supersedes it. A step never read whole stays a gap."""
    from truestep.audit.rundir import _lines

    a = Attempt(0, ["train"], 100.0, exit_code=0, exited=110.0, down=110.5)
    a.records = [
        Seen(Record(3, (("loss", 1.0),)), 101.0),  # the loss flushed, the grad norm not yet
        Seen(Record(3, (("grad_norm", 1.0), ("loss", 1.0))), 101.2),
        Seen(Record(4, (("loss", 0.5),)), 101.5),  # never read whole
    ]
    lines, incomplete = _lines(a, 1)
    assert [line["step"] for line in lines] == [3]
    assert incomplete == [4]


def test_a_usable_step_read_before_its_last_tag_is_superseded_by_the_fuller_read(tmp_path: Path) -> None:
    """CI, stop 43: a reference's step was read with loss and grad norm but before its lr was flushed,
    then whole: two lines of one step, and the failure-free reference was refused as restarted. The
    fuller read replaces the earlier; a step logged again with other values is still two lines."""
    from truestep.audit.rundir import _lines

    a = Attempt(0, ["train"], 100.0, exit_code=0, exited=110.0, down=110.5)
    a.records = [
        Seen(Record(3, (("loss", 1.0), ("grad_norm", 2.0))), 101.0),
        Seen(Record(3, (("loss", 1.0), ("grad_norm", 2.0), ("lr", 0.1))), 101.2),
        Seen(Record(5, (("loss", 0.5), ("grad_norm", 1.0))), 101.5),
        Seen(Record(5, (("loss", 0.25), ("grad_norm", 1.0))), 101.7),  # logged twice: not a partial read
    ]
    lines, incomplete = _lines(a, 1)
    assert [(line["step"], line.get("lr")) for line in lines] == [(3, 0.1), (5, None), (5, None)]
    assert incomplete == []
