"""`truestep launch [CONFIG] --nproc N [--max-restarts K] [--section.key=value ...]`: the local supervisor."""

from __future__ import annotations

import argparse
from pathlib import Path

from truestep.config.load import load_config
from truestep.config.validate import validate_layout
from truestep.core.launch import Launch, bounded_id
from truestep.core.names import ENV_JOB_ID
from truestep.core.rundir import check_run_dir
from truestep.faults.optin import ALLOW_FLAG, faults_to_arm
from truestep.faults.spec import parse_faults
from truestep.supervisor.restart_loop import LaunchSpec, run_supervisor


def launch_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="truestep launch",
        description="Run the ranks of one node, detect failures and hangs in seconds, restart from the "
        "newest verified checkpoint. Exit codes: docs/resilience.md (0 finished, 75 preempted: requeue me, "
        "130 interrupted, 2 usage, 3 refused input, 4 run directory in use, 5 fenced, 6 filesystem refused a "
        "write, 1 gave up).",
    )
    parser.add_argument("config", nargs="?", default="tiny", help="TOML file or preset name (default: tiny)")
    parser.add_argument("--nproc", type=int, default=1, help="ranks on this node")
    parser.add_argument("--max-restarts", type=int, default=3, help="restarts after failures/requeues")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=0, help="0 = a free port per attempt (1 node)")
    parser.add_argument(
        "--job-id",
        default="",
        help="identity of the job that owns the run directory; every node of a job must pass the same "
        f"(default: ${ENV_JOB_ID}, else $SLURM_JOB_ID, else MASTER_ADDR:MASTER_PORT with --nnodes > 1)",
    )
    parser.add_argument(
        "--fault", action="append", default=[], help="fault spec (repeatable); see docs/faults.md"
    )
    parser.add_argument(
        ALLOW_FLAG, action="store_true", help="arm the faults of $TRUESTEP_FAULTS (docs/faults.md)"
    )
    args, overrides = parser.parse_known_args(argv)
    if args.nproc < 1 or args.nnodes < 1 or args.max_restarts < 0:
        parser.error("--nproc and --nnodes must be >= 1, --max-restarts >= 0")
    if not 0 <= args.node_rank < args.nnodes:
        parser.error(f"--node-rank must be in [0, {args.nnodes})")
    if args.nnodes > 1 and not args.master_port:
        parser.error("--master-port is required with --nnodes > 1 (all nodes must agree on it)")
    cfg = load_config(args.config, overrides)
    allowed = args.allow_env_faults or cfg.run.allow_env_faults
    # What every rank's launch record inherits (refused here if TRUESTEP_FAULTS was not asked for).
    launch = faults_to_arm(Launch.from_env(), args.fault, allowed, "truestep launch")
    for spec in parse_faults(launch.faults):  # reject a bad spec here, not in N children
        if spec.node is not None and not 0 <= spec.node < args.nnodes:
            parser.error(
                f"fault {spec.text!r}: node {spec.node} is not one of this job's {args.nnodes} nodes"
            )
    validate_layout(cfg, args.nproc * args.nnodes)  # fail here, not in N children
    check_run_dir(Path(cfg.run.dir))  # before the supervisor writes its first event into it
    # The nodes of a multi-node job agree on their rendezvous: without an id given, that names the job.
    job = bounded_id(args.job_id) or launch.job_identity(
        f"{args.master_addr}:{args.master_port}" if args.nnodes > 1 else ""
    )
    spec = LaunchSpec(
        nproc=args.nproc,
        max_restarts=args.max_restarts,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        job_id=job,
        launch=launch,
    )
    return run_supervisor(spec, cfg)
