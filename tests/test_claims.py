"""Issue 38, items 1 and 2 on real runs (the tiny model, in-process ranks, real checkpoints): a verdict
about recovery needs the recovery it claims, runs whose provenance matches the reference's, and logs
that belong to the directory they are read from.

Real runs (besides the session's in-process reference): a stop-and-resume that is bitwise, a run armed
with a fault that never fires, a reference and a floor repeat on one data.path re-prepared with other
text in between, a floor repeat started from `checkpoint.init_from`; every other case is made from
copies of them -- the reference copied, another run's logs in a directory with its own lease or none, a
resumed run whose final checkpoint is gone, a run whose code digest differs. Each was a pass (exit 0)
before: now refused (exit 3) or INCOMPLETE (exit 8)."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from harness import INPROCESS_JOB, run_in_process
from truestep.analysis.floor import measure_floor
from truestep.analysis.report.opening import verdict_paragraph
from truestep.analysis.runlog import RunLog, RunLogError
from truestep.analysis.summary import analyze_run
from truestep.analysis.verdict import Status
from truestep.data.shards import prepare_data
from truestep.experiment.summary import summarize

UNFIRED = "kill:rank=0:step=99"
"""Armed in an 8-step job: it can never fire."""


def run_with_fault(run_dir: Path, spec: str) -> int:
    """harness.run_in_process with a fault armed in the rank's launch record (as --fault arms it)."""
    from harness import TINY
    from truestep.config.load import load_config
    from truestep.core.launch import Launch
    from truestep.train.rank import run_rank

    cfg = load_config("tiny", [f"--run.dir={run_dir}", *TINY, *INPROCESS_JOB])
    return run_rank(cfg, Launch().with_faults([spec]))


@pytest.fixture(scope="module")
def runs(inprocess_reference: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("claims")
    assert run_in_process(base / "resumed", *INPROCESS_JOB, "--train.stop_at_step=4") == 0
    assert run_in_process(base / "resumed", *INPROCESS_JOB) == 0
    assert run_with_fault(base / "unfired", UNFIRED) == 0
    corpus, data = base / "corpus.txt", base / "data"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 300)
    prepare_data([corpus], data)
    assert run_in_process(base / "data-ref", *INPROCESS_JOB, f"--data.path={data}") == 0
    init = f"--checkpoint.init_from={base / 'data-ref' / 'checkpoints' / 'step_00000004'}"
    assert run_in_process(base / "init", *INPROCESS_JOB, f"--data.path={data}", init) == 0
    corpus.write_text("lorem ipsum dolor sit amet. " * 300)
    prepare_data([corpus], data, resume=False)  # the same data.path, re-prepared with other text
    assert run_in_process(base / "data-floor", *INPROCESS_JOB, f"--data.path={data}") == 0
    names = ("resumed", "unfired", "data-ref", "data-floor", "init")
    return {"ref": inprocess_reference, **{name: base / name for name in names}}


def judge(run: Path, ref: Path, role: str = "run", **kw):
    return analyze_run(run.name, RunLog.load(run), RunLog.load(ref), None, role, **kw)


def edit_lease(run: Path, run_id: str | None) -> None:
    """Give the directory's lease another run id (None: remove the lease)."""
    lease = run / "lease.json"
    if run_id is None:
        lease.unlink()
        return
    lease.write_text(json.dumps({**json.loads(lease.read_text()), "run_id": run_id}))


def test_a_resume_is_judged_on_the_parameters_re_read(runs) -> None:
    v = judge(runs["resumed"], runs["ref"]).verdict
    assert v.status is Status.BITWISE and v.exit_code == 0, v.label
    assert "final parameters" in v.label and "logged digests only" not in v.label


def test_a_fault_that_never_fired_is_no_recovery(runs, tmp_path: Path) -> None:
    """The audit: `--fault kill:rank=1:step=99` on a 30-step job reported PASS, 'Recovery was correct:
    after 0 injected faults and 0 resumes', exit 0. As the run under test it is refused; in an experiment
    it is INCOMPLETE, naming the fault that did not fire and the resume that did not happen."""
    with pytest.raises(RunLogError, match=f"failure-free run .*never fired: {UNFIRED}"):
        judge(runs["unfired"], runs["ref"])
    v = judge(runs["unfired"], runs["ref"], "faulted").verdict
    assert v.status is Status.INCOMPLETE and v.exit_code == 8
    assert v.label.startswith(f"INCOMPLETE: named faults never fired ({UNFIRED})")
    assert [g.what for g in v.gaps][:2] == [
        "named faults never fired",
        "the run never resumed from a checkpoint",
    ]
    # The same through an experiment directory and its report's opening paragraph.
    for name in ("reference", "faulted"):
        shutil.copytree(runs["ref" if name == "reference" else "unfired"], tmp_path / "runs" / name)
    jobs = [
        {"name": "reference", "role": "reference"},
        {"name": "faulted", "role": "faulted", "faults": [UNFIRED]},
    ]
    (tmp_path / "experiment.json").write_text(json.dumps({"jobs": jobs}))
    summary = summarize(tmp_path, write=False)
    assert summary.verdict.head == "INCOMPLETE" and summary.verdict.exit_code == 8
    text = verdict_paragraph(summary)
    assert "Recovery was correct" not in text and "named faults never fired" in text


def test_a_declared_fault_the_logs_never_armed_is_a_gap(runs) -> None:
    """An experiment's job faults count even where no run_start names them (a lost events.jsonl)."""
    v = judge(runs["resumed"], runs["ref"], "faulted", declared_faults=["term:step=3"]).verdict
    assert v.status is Status.INCOMPLETE and v.gaps[0].text == "named faults never fired (term:step=3)"


def test_the_reference_or_a_copy_of_it_is_refused(runs, tmp_path: Path) -> None:
    """The audit: a run under test that is a copy of the reference was 'bitwise', exit 0."""
    with pytest.raises(RunLogError, match="is the reference or a copy of it"):
        judge(runs["ref"], runs["ref"])
    shutil.copytree(runs["ref"], tmp_path / "copy")
    for role in ("run", "faulted"):
        with pytest.raises(RunLogError, match="is the reference or a copy of it"):
            judge(tmp_path / "copy", runs["ref"], role)


def test_another_runs_logs_are_refused(runs, tmp_path: Path) -> None:
    """The audit: a directory holding another run's logs, its checkpoints gone, was 'bitwise ... final
    parameters', exit 0 (the stale run_end digest stood in for the parameters)."""
    moved = tmp_path / "moved"
    shutil.copytree(runs["resumed"], moved)
    shutil.rmtree(moved / "checkpoints")
    edit_lease(moved, uuid.uuid4().hex)
    with pytest.raises(RunLogError, match="holds another run's logs .*the directory's lease is run"):
        judge(moved, runs["ref"])
    edit_lease(moved, None)
    with pytest.raises(RunLogError, match="holds another run's logs .*has no lease naming a run"):
        judge(moved, runs["ref"])


def test_a_final_checkpoint_that_is_gone_is_not_final_parameters(runs, tmp_path: Path) -> None:
    """The run's own logs (lease and run id intact), its final checkpoint deleted: the logged digest can
    no longer be re-read, so the verdict does not say 'final parameters'."""
    gone = tmp_path / "gone"
    shutil.copytree(runs["resumed"], gone)
    shutil.rmtree(gone / "checkpoints" / "step_00000008")
    v = judge(gone, runs["ref"]).verdict
    assert v.status is Status.INCOMPLETE and v.exit_code == 8
    assert v.gaps[0].text.startswith("the run's final checkpoint is gone at step 8")


def test_a_restart_that_did_not_restore_is_named(runs, tmp_path: Path) -> None:
    """A second attempt whose checkpoint_restore is missing (it started over, or the event was lost):
    the run resumed fewer times than it restarted."""
    run = tmp_path / "restarted"
    shutil.copytree(runs["resumed"], run)
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    kept = [e for e in events if e["event"] != "checkpoint_restore"]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    v = judge(run, runs["ref"]).verdict
    assert v.status is Status.INCOMPLETE
    assert v.gaps[0].text.startswith("the run never resumed from a checkpoint")


def edit_provenance(run: Path, key: str, value: str, attempts: tuple[int, ...] = (0, 1)) -> RunLog:
    """Rewrite one provenance field of some attempts' run_start (what another code version records)."""
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    for e in events:
        if e["event"] == "run_start" and e["attempt"] in attempts:
            e["provenance"] = {**e["provenance"], key: value}
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return RunLog.load(run)


def test_a_floor_on_re_prepared_data_is_refused(runs) -> None:
    """The audit: floors re-run after the corpus at the same data.path was re-prepared with other text
    were accepted (same config fingerprint) and the envelope grew 1,000x. The data digest differs."""
    ref, floor = RunLog.load(runs["data-ref"]), RunLog.load(runs["data-floor"])
    assert ref.fingerprints() == floor.fingerprints()
    with pytest.raises(RunLogError) as err:
        measure_floor(ref, [floor])
    assert "\n" not in str(err.value) and err.value.exit_code == 3
    assert "data (digest of the token shards)" in str(err.value) and "--allow-provenance-mismatch" in str(
        err.value
    )
    model = measure_floor(ref, [floor], any_provenance=True)
    assert "PROVENANCE DIFFERS: data (digest of the token shards)" in model.label


def test_a_floor_started_from_init_from_is_refused(runs) -> None:
    """The audit: floors made with checkpoint.init_from were accepted (not a trajectory key)."""
    with pytest.raises(RunLogError, match="init source \\(checkpoint.init_from\\)") as err:
        measure_floor(RunLog.load(runs["data-ref"]), [RunLog.load(runs["init"])])
    assert "data (" not in str(err.value)  # the same data: the init source is all that differs


def test_other_code_is_refused_and_compared_only_when_asked(runs, tmp_path: Path) -> None:
    """The audit: a floor from another code version (the cosine span off by one) made a 3e-3 restore
    error pass; nothing recorded which code ran. A floor repeat, and the run under test's resumed attempt,
    whose source digest is not the reference's are refused; compared anyway, every label says so."""
    other = tmp_path / "other-code"
    shutil.copytree(runs["data-ref"], other)
    edited = edit_provenance(other, "source_sha256", "0" * 64)
    with pytest.raises(RunLogError, match="code \\(digest of the installed source\\): 000000000000"):
        measure_floor(RunLog.load(runs["data-ref"]), [edited])
    resumed = tmp_path / "resumed"
    shutil.copytree(runs["resumed"], resumed)
    edit_provenance(resumed, "source_sha256", "1" * 64, attempts=(1,))
    with pytest.raises(RunLogError, match="resumed attempt 1"):
        judge(resumed, runs["ref"])
    v = judge(resumed, runs["ref"], any_provenance=True).verdict
    assert v.status is Status.BITWISE and "[PROVENANCE DIFFERS, compared anyway: code" in v.label


def test_two_processes_started_within_one_floats_resolution_are_two_runs(tmp_path: Path) -> None:
    """CI, this stop: a reference and another run launched side by side logged the same process_start and
    run_start time (equal doubles: ~0.24 us apart at most), and the resumed copy of the other was refused
    as a copy of the reference. Which process an attempt was includes its pid; a copy keeps it."""
    from analysis_cases import line, start, write_run
    from truestep.analysis.provenance import same_run

    metrics = [line(1, 0, 6.0)]
    a = write_run(tmp_path / "a", metrics, [{**start(0, 5.0, 2.0), "pid": 101}])
    b = write_run(tmp_path / "b", metrics, [{**start(0, 5.0, 2.0), "pid": 202}])
    assert not same_run(a, b)
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    assert same_run(RunLog.load(tmp_path / "copy"), a)
