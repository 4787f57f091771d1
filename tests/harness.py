"""Launch real truestep processes (single or under torchrun with gloo) and read their run directories."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from forkserver import forks

# A tiny model: steps take milliseconds, so multi-process tests on 2 cores stay quick.
TINY = [
    "--model.dim=64",
    "--model.n_layers=2",
    "--model.n_heads=4",
    "--model.n_kv_heads=2",
    "--model.vocab_size=512",
    "--model.multiple_of=32",
    "--model.max_seq_len=64",
    "--data.seq_len=32",
    "--train.global_batch_size=8",
    "--metrics.progress=false",
    "--metrics.step_lines=false",  # a quiet console: tests of a refusal expect its one line alone
    "--metrics.banner=false",
]

# The layouts the suite covers: name -> (processes, overrides).
LAYOUTS: dict[str, tuple[int, list[str]]] = {
    "single": (1, []),
    "fsdp2": (2, []),
    "tp2": (2, ["--parallel.tp=2"]),
    "fsdp2xtp2": (4, ["--parallel.tp=2"]),
}


# The failure-free run per layout (conftest.py `layout_references`) that resumed runs must match.
LAYOUT_STEPS = 8
LAYOUT_REFERENCE = [
    f"--train.max_steps={LAYOUT_STEPS}",
    "--checkpoint.interval=0",
    "--schedule.warmup_steps=2",
]


def truestep_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env.pop("TRUESTEP_FAULTS", None)
    env.update(extra or {})
    return env


def launch(
    run_dir: Path,
    *overrides: str,
    nproc: int = 1,
    config: str = "tiny",
    env: dict[str, str] | None = None,
    timeout: float = 240,
    check: bool = True,
    launcher: str = "fork",
) -> subprocess.CompletedProcess:
    """Run `truestep train` on the tiny test model: `nproc` processes forked by the tests' fork server
    with torchrun's environment (forkserver.py), or with launcher="torchrun" under torchrun --standalone
    (the layout references: what every forked or supervised resume must match bit for bit).

    One process with nothing a process is needed for (no fault, no environment of its own) runs in this
    test process (`run_in_process`: the same rank through its front door, without the seconds of a fresh
    interpreter importing torch); a config that does not load goes through the real CLI, whose one-line
    refusal is what a test of it expects."""
    assert launcher in ("fork", "torchrun"), launcher
    in_main_thread = threading.current_thread() is threading.main_thread()  # a rank installs signal handlers
    if (
        nproc == 1
        and launcher == "fork"
        and not env
        and in_main_thread
        and not any(o.startswith("--fault") for o in overrides)
    ):
        done = _in_process(run_dir, config, list(overrides))
        if done is not None:
            if check and done.returncode != 0:
                raise AssertionError(
                    f"in-process {done.args} exited {done.returncode}\n{done.stderr[-6000:]}"
                )
            return done
    args = ["train", config, f"--run.dir={run_dir}", *TINY, *overrides]
    if (env or {}).get("TRUESTEP_FAULTS"):
        args.append("--allow-env-faults")  # this test arms faults through the environment on purpose
    if launcher == "fork":  # processes forked by the tests' server, which imported torch once
        proc = forks().run_ranks(args, rank_envs(truestep_env(env), nproc), timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"truestep {' '.join(args)} ({nproc} forked ranks) exited {proc.returncode}\n"
                f"--- stderr ---\n{proc.stderr[-6000:]}"
            )
        return proc
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "truestep",
        *args,
    ]
    proc = subprocess.run(cmd, env=truestep_env(env), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


def rank_envs(env: dict[str, str], nproc: int) -> list[dict[str, str]]:
    """Each rank's environment in a one-node job of `nproc` ranks: `env` and what torchrun would add
    that a rank reads (core/launch.py), with a free local port for rank 0's store."""
    if nproc == 1:
        return [env]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    from truestep.core import launch as names  # the variables' names, as the rank reads them

    job = {
        names.WORLD_SIZE: str(nproc),
        names.LOCAL_WORLD_SIZE: str(nproc),
        names.GROUP_RANK: "0",
        names.MASTER_ADDR: "127.0.0.1",
        names.MASTER_PORT: str(port),
    }
    return [{**env, **job, names.RANK: str(rank), names.LOCAL_RANK: str(rank)} for rank in range(nproc)]


def _in_process(run_dir: Path, config: str, overrides: list[str]) -> subprocess.CompletedProcess | None:
    """The run as a completed process (its code, what it said); None when its config does not load."""
    from truestep.config.load import load_config
    from truestep.core.errors import TruestepError

    try:
        load_config(config, [f"--run.dir={run_dir}", *TINY, *overrides])
    except TruestepError:
        return None
    from truestep.cli.main import report

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_in_process(run_dir, *overrides, config=config)
        except Exception as failure:  # what `truestep train` makes of it: one line and its code, or raised
            code = report("train", failure)
    return subprocess.CompletedProcess(["train", config, *overrides], code, out.getvalue(), err.getvalue())


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def metrics(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


def events(run_dir: Path, name: str | None = None) -> list[dict]:
    found = read_jsonl(run_dir / "events.jsonl")
    return [e for e in found if name is None or e["event"] == name]


def bits(x: float) -> str:
    """The float32 bit pattern of a logged value (losses are fp32 values stored exactly in JSON)."""
    return struct.pack(">f", x).hex()


def loss_bits_by_step(run_dir: Path) -> dict[int, str]:
    """step -> bit pattern of the loss; a step logged twice (recomputed after a crash) keeps the last."""
    return {m["step"]: bits(m["loss"]) for m in metrics(run_dir)}


def final_digest(run_dir: Path) -> str:
    ends = events(run_dir, "run_end")
    assert ends, f"{run_dir}: no run_end event"
    return ends[-1]["param_digest"]


# The in-process reference job (conftest.py `inprocess_reference`): two checkpoints, a warm-up that ends.
INPROCESS_STEPS = 8
INPROCESS_JOB = [
    f"--train.max_steps={INPROCESS_STEPS}",
    "--checkpoint.interval=4",
    "--schedule.warmup_steps=2",
]


def run_in_process(run_dir: Path, *overrides: str, config: str = "tiny") -> int:
    """Run one single-process rank of the tiny test model inside this test process (train/rank.py:
    `run_rank` returns its exit code): the same config and record a `truestep train` subprocess gets,
    without the seconds of a fresh interpreter importing torch."""
    from truestep.config.load import load_config
    from truestep.core.launch import Launch
    from truestep.train.rank import run_rank

    cfg = load_config(config, [f"--run.dir={run_dir}", *TINY, *overrides])
    return run_rank(cfg, Launch())


def run_in_process_captured(run_dir: Path, *overrides: str, config: str = "tiny") -> tuple[int, str]:
    """`run_in_process`, and what the rank said on stderr (its lines are printed to sys.stderr)."""
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        code = run_in_process(run_dir, *overrides, config=config)
    return code, said.getvalue()


def gloo_ranks(worker: Callable[..., None], args: tuple, nprocs: int) -> None:
    """`torch.multiprocessing.spawn(worker, args, nprocs)` with the ranks forked by multiprocessing's
    fork server, which imports torch and the test's rank modules once per session (a spawned rank
    imports them itself: ~3 CPU-s each); a rank that fails still fails the call with its traceback."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(["torch", "init_cases", "integrity_cases"])  # read at its start
    mp.start_processes(worker, args=args, nprocs=nprocs, start_method="forkserver")
