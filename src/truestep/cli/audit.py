"""`truestep audit`: the instrument for any trainer (src/truestep/audit/, docs/audit.md).

Exit codes as `truestep experiment`: 0 the faulted run is trajectory-preserving, 1 it was shown not to
be, 8 the evidence is incomplete (a fault that never fired, a restart that did not resume, steps
missing, final parameters not compared); 2 bad arguments, 3 a failure-free run could not serve.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from truestep.analysis.fidelity import DEFAULT_MARGIN
from truestep.audit.plan import DEFAULT_REPEATS, AuditPlan, run_audit
from truestep.audit.spec import check_path, parse_command, parse_fault, parse_logs
from truestep.core.errors import UsageError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="truestep audit",
        usage="truestep audit --out DIR --logs FORMAT:PATH [--fault SPEC ...] [--repeats K] [--weights PATH] "
        "[--tags NAME=TAG,...] -- COMMAND ARGS...",
        description="Run your own training command as a black box: a failure-free reference, K same-seed "
        "repeats (the floor) and a run hit by the faults, restarted until it finishes; then the verdict, "
        "evidence ledger, goodput, MTTR and report of `truestep experiment`. {run_dir} in COMMAND, --logs "
        "and --weights is each run's own directory; the command must resume by itself when started again "
        "on it.",
    )
    p.add_argument("--out", required=True, help="a fresh output directory")
    p.add_argument(
        "--logs",
        required=True,
        help="tensorboard:PATH (event files), hf:PATH (trainer_state.json or the output_dir holding "
        "checkpoint-N/) or jsonl:PATH; relative to the run's directory unless it contains {run_dir}",
    )
    p.add_argument(
        "--tags",
        help="NAME=TAG,... for loss, grad_norm, lr (and step for jsonl); defaults fit Hugging Face Trainer: "
        "train/loss, train/grad_norm, train/learning_rate (tensorboard), loss, grad_norm, learning_rate (hf)",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        help="kill@step=N, term@step=N, kill@time=S or term@time=S (repeatable; all hit the faulted run)",
    )
    p.add_argument(
        "--repeats", type=int, default=DEFAULT_REPEATS, help="same-seed repeats for the floor (K >= 2)"
    )
    p.add_argument(
        "--weights",
        help="the final weights file a run writes (safetensors or torch): its digest joins the evidence",
    )
    p.add_argument(
        "--max-restarts", type=int, default=4, help="restarts of one run before the audit gives up"
    )
    p.add_argument("--grace", type=float, default=30.0, help="seconds between term's SIGTERM and the SIGKILL")
    p.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds one run may take, restarts included"
    )
    p.add_argument(
        "--tokens-per-step", type=int, default=1, help="for goodput in tokens/s (default 1: steps/s)"
    )
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help="threshold = margin x leave-one-out")
    return p


def audit_main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    p = parser()
    a = p.parse_args(argv[:split])
    command = parse_command(argv[split:])
    if a.repeats < 2:
        raise UsageError(
            "--repeats must be >= 2: the floor of a trainer that is not bitwise needs two repeats"
        )
    if not a.fault:
        raise UsageError("nothing to measure: give --fault (kill@step=N, term@step=N, kill@time=S)")
    if a.max_restarts < 1 or a.grace < 0 or a.timeout <= 0 or a.tokens_per_step < 1:
        raise UsageError("--max-restarts and --tokens-per-step must be >= 1, --grace >= 0, --timeout > 0")
    if a.weights is not None:
        check_path(a.weights, "--weights")
    plan = AuditPlan(
        command=command,
        logs=parse_logs(a.logs, a.tags),
        faults=[parse_fault(f) for f in a.fault],
        repeats=a.repeats,
        weights=a.weights,
        max_restarts=a.max_restarts,
        grace_s=a.grace,
        timeout_s=a.timeout,
        tokens_per_step=a.tokens_per_step,
        margin=a.margin,
    )
    return run_audit(Path(a.out), plan)
