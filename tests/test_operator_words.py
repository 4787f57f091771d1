"""Words an operator reads (issue 40): what the console, the job logs and `truestep ckpt` say must say
what happened and why, in one line each, never a raw PyTorch traceback."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch


def test_a_missing_dcp_metadata_is_one_line_not_a_torch_traceback(tmp_path: Path, caplog) -> None:
    """DCP's loader logs a missing `.metadata` with exc_info to the root logger (the traceback that filled
    the demo's atomic-commit ablation logs); truestep keeps the line and the error, not the traceback."""
    import torch.distributed.checkpoint as dcp

    from truestep.checkpoint.safe_dcp import SafeFileSystemReader, single_process

    with caplog.at_level(logging.WARNING), single_process(), pytest.raises(BaseException, match="metadata"):
        dcp.load({"w": torch.zeros(2)}, storage_reader=SafeFileSystemReader(tmp_path))
    [record] = [r for r in caplog.records if "metadata is not found" in r.getMessage()]
    text = logging.Formatter().format(record)
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert "FileNotFoundError" in text and ".metadata" in text


def test_ckpt_verify_of_a_quarantined_checkpoint_gives_the_recorded_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "commit marker does not name this directory's step" (true of any moved checkpoint) instead
    of why it was quarantined (a SHA-256 mismatch)."""
    from harness import run_in_process
    from truestep.checkpoint.catalog import step_dir_name
    from truestep.checkpoint.resolver import quarantine_logged
    from truestep.cli.ckpt import ckpt_main
    from truestep.telemetry.run_logs import RunLogs

    run = tmp_path / "run"
    assert run_in_process(run, "--train.max_steps=2", "--checkpoint.interval=0") == 0
    reason = "SHA-256 mismatch: __0_0.distcp item 3 (rank 0)"
    logs = RunLogs(run, attempt=1, enabled=True)
    moved = quarantine_logged(run / "checkpoints" / step_dir_name(2), reason, logs)
    logs.close()
    capsys.readouterr()
    assert ckpt_main(["verify", str(moved)]) == 1
    err = capsys.readouterr().err
    assert f"(quarantined): set aside because: {reason}; never resumed from" in err, err
    assert len(err.strip().splitlines()) == 1


def test_the_report_says_repeated_blocks_once(tmp_path: Path) -> None:
    """The demo's report was 1,248 lines: every floor repeat and ablation cell got the reference's full
    set of tables, with a dozen zero badput rows each and the MTTR explanation each time. A run reported
    in full keeps everything; a floor repeat or an ablation cell keeps what is its own."""
    import json
    import shutil

    from test_report import make_experiment, summarize
    from truestep.analysis.report.document import Figures, build_blocks
    from truestep.analysis.report.markdown import render_markdown

    make_experiment(tmp_path)
    plan = json.loads((tmp_path / "experiment.json").read_text())
    for n in range(3):  # more cells, as in the demo (ten)
        name = f"ablation-x{n}-hard"
        shutil.copytree(tmp_path / "runs" / "ablation-rng-restore-off-hard", tmp_path / "runs" / name)
        plan["jobs"].append({"name": name, "role": "ablation", "row": f"x{n}", "mode": "hard"})
    (tmp_path / "experiment.json").write_text(json.dumps(plan))
    md = render_markdown(build_blocks(summarize(tmp_path), Figures(), tmp_path), tmp_path)  # no plots: slow
    sections = {s.split("`", 1)[0]: s for s in md.split("### Run `")[1:]}
    assert "#### Badput" in sections["faulted"] and "#### Badput" in sections["reference"]
    for name in ("floor", "ablation-all-on-hard", "ablation-x0-hard"):
        assert "#### Goodput" not in sections[name] and "summary.json" in sections[name], name
    assert "#### Fidelity" not in sections["floor"] and "#### Fidelity" in sections["ablation-x0-hard"]
    assert "#### Fidelity" not in sections["ablation-all-on-hard"]  # bitwise: its paragraph says so
    assert "| restored | 5 |" in sections["ablation-all-on-hard"]  # its recovery path is its own
    assert md.count("Per incident -- a fault injected") == 1
    assert "| not running | 0 s |" not in md and "0 s: " in sections["reference"]
    per_cell = len(sections["ablation-x0-hard"].splitlines())
    assert per_cell < 50, per_cell
