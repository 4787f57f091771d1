"""A fork server for the tests' `truestep train` runs (harness.launch), one process or a job's ranks.

A fresh interpreter spends ~2.5 CPU-s importing torch and truestep before a tiny run's first step, and
the session's background runs (conftest.py's pool: the crash, corruption, pickle and config cases) start
about ninety of them from threads, where a run cannot be made in-process (a rank installs signal
handlers). This server imports once and forks each run, as the product's warm template forks ranks
(supervisor/handoff.py): the child leads its own session, adopts the run's environment, working
directory and argv, puts the torch RNG back to what `import torch` left, restarts the process clock and
runs `truestep.cli.main.main` -- a real process, with its own exit code, signals and output. A job of
several ranks (`run_ranks`) is what torchrun makes of it, less torchrun's own interpreter and each
worker's imports: one forked process per rank with torchrun's variables (harness.rank_envs), the rest
terminated when one fails, code 1 for a failed job.

The server is `python tests/forkserver.py`, one JSON object per line each way on its stdin/stdout:
requests {"id", "argv", "env", "cwd", "stdout", "stderr"}; answers {"id", "pid"} once forked and
{"id", "code"} (Popen's convention: -N for signal N) once the child is reaped. {"signal", "ids"} asks it
to signal those of the ids' children it has not reaped (it alone reaps them, so never a reused pid). At
EOF (the tests' process ended, even killed) it kills the children still running, reaps them and exits:
a stopped or hung run outlives nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

POLL_S = 0.02
TERM_GRACE_S = 30.0
"""How long a job's other processes have between SIGTERM and SIGKILL once one failed (torchrun's)."""


def _child(request: dict, rng: object) -> None:
    """In the forked process: become the run, and never return."""
    code = 1
    try:
        os.setsid()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        import torch

        import truestep
        from truestep.cli.main import main

        torch.set_rng_state(rng)  # type: ignore[arg-type]
        truestep.STARTED_AT = time.time()
        sys.argv = ["truestep", *request["argv"]]
        code = main(list(request["argv"]))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    except BaseException:  # noqa: BLE001 - a fresh interpreter would print it and exit 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    import torch

    rng = torch.get_rng_state()  # what a fresh process's default generator holds after `import torch`
    import importlib

    from truestep.train.warm import LAZY_MODULES

    # What a run imports (train/warm.py's list, under train.deterministic too), and the CLI.
    for name in ("truestep.cli.main", "truestep.train.run", "torch._inductor.config", *LAZY_MODULES):
        importlib.import_module(name)

    if len(os.listdir("/proc/self/task")) != 1:
        raise SystemExit("forkserver: the imports left threads; it forks only single-threaded")
    children: dict[int, int] = {}
    pending = b""
    open_input = True
    while open_input or children:
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            _answer({"id": children.pop(pid), "code": os.waitstatus_to_exitcode(status)})
        if not open_input:
            time.sleep(POLL_S)
            continue
        if select.select([0], [], [], POLL_S)[0]:
            chunk = os.read(0, 65536)
            open_input = bool(chunk)
            if not open_input:  # the tests' process is gone or done: nobody waits for what is left
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
            pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            if "signal" in request:  # only a child not reaped yet: its pid cannot have been reused
                for pid, ident in children.items():
                    if ident in request["ids"]:
                        os.kill(pid, request["signal"])
                continue
            pid = os.fork()
            if pid == 0:
                _child(request, rng)
            children[pid] = request["id"]
            _answer({"id": request["id"], "pid": pid})


def _answer(record: dict) -> None:
    with contextlib.suppress(BrokenPipeError):  # the tests' process is gone: its runs were killed at EOF
        os.write(1, (json.dumps(record) + "\n").encode())


# ------------------------------------------------------------------------------ the tests' side


class ForkServer:
    """The session's server (started on first use, ended at exit) and the runs it forks for any thread."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},  # what each run gets (harness.truestep_env)
        )
        self.lock = threading.Lock()
        self.next_id = 0
        self.waiting: dict[int, queue.Queue] = {}
        self.outputs = Path(tempfile.mkdtemp(prefix="truestep-forks-"))
        threading.Thread(target=self._read, name="forkserver-answers", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            answer = json.loads(line)
            with self.lock:
                box = self.waiting.get(answer["id"])
            if box is not None:
                box.put(answer)
        with self.lock:  # the server is gone: nobody waits forever
            for box in self.waiting.values():
                box.put({"gone": True})

    def run(self, argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        """`python -m truestep ARGV` as a process forked by the server: its code and what it printed."""
        return self.run_ranks(argv, [env], timeout)

    def run_ranks(
        self, argv: list[str], envs: list[dict[str, str]], timeout: float
    ) -> subprocess.CompletedProcess:
        """One process per environment, all running `python -m truestep ARGV`, as torchrun runs a job's
        workers: the first to fail has the others terminated (SIGTERM, then SIGKILL after TERM_GRACE_S)
        and makes the job's code 1 (torchrun's); all ending 0 make it 0. Their output is each process's in
        turn, the first environment's first. One process keeps its own code."""
        started = [self._submit(argv, env) for env in envs]
        try:
            for _, box, _, _ in started:
                self._get(box, 60)  # forked
            codes = self._wait_all(started, timeout, argv)
        finally:
            with self.lock:
                for ident, _, _, _ in started:
                    self.waiting.pop(ident, None)
        out = "".join(path.read_text() for _, _, path, _ in started)
        err = "".join(path.read_text() for _, _, _, path in started)
        for _, _, out_path, err_path in started:
            out_path.unlink()
            err_path.unlink()
        code = codes[0] if len(codes) == 1 else (0 if not any(codes) else 1)
        return subprocess.CompletedProcess(["truestep", *argv], code, out, err)

    def _submit(self, argv: list[str], env: dict[str, str]) -> tuple[int, queue.Queue, Path, Path]:
        with self.lock:
            self.next_id += 1
            ident, box = self.next_id, queue.Queue()
            self.waiting[ident] = box
            out, err = self.outputs / f"{ident}.out", self.outputs / f"{ident}.err"
            request = {
                "id": ident,
                "argv": argv,
                "env": env,
                "cwd": os.getcwd(),
                "stdout": str(out),
                "stderr": str(err),
            }
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        return ident, box, out, err

    def _wait_all(self, started: list, timeout: float, argv: list[str]) -> list[int]:
        """Every process's code; the first non-zero one terminates the rest, a timeout kills them all."""
        codes: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        kill_at: float | None = None
        while len(codes) < len(started):
            for index, (_, box, _, _) in enumerate(started):
                if index not in codes:
                    with contextlib.suppress(queue.Empty):
                        codes[index] = self._get(box, 0)["code"]
                        if codes[index] != 0 and kill_at is None and len(started) > 1:
                            kill_at = time.monotonic() + TERM_GRACE_S
                            self._signal(started, codes, signal.SIGTERM)
            now = time.monotonic()
            if now > deadline:
                self._signal(started, codes, signal.SIGKILL)
                for index, (_, box, _, _) in enumerate(started):
                    if index not in codes:
                        self._get(box, 60)
                raise subprocess.TimeoutExpired(["truestep", *argv], timeout)
            if kill_at is not None and now > kill_at:
                self._signal(started, codes, signal.SIGKILL)
                kill_at = float("inf")
            if len(codes) < len(started):
                time.sleep(POLL_S)
        return [codes[index] for index in range(len(started))]

    def _signal(self, started: list, done: dict[int, int], signum: int) -> None:
        """Have the server send `signum` to the processes of `started` that have not ended."""
        ids = [ident for index, (ident, _, _, _) in enumerate(started) if index not in done]
        with self.lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps({"signal": int(signum), "ids": ids}) + "\n").encode())
            self.proc.stdin.flush()

    def _get(self, box: queue.Queue, timeout: float) -> dict:
        answer = box.get(timeout=timeout)
        if answer.get("gone"):
            raise RuntimeError(f"the tests' fork server exited ({self.proc.poll()})")
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.outputs, ignore_errors=True)


_server: ForkServer | None = None
_server_lock = threading.Lock()


def forks() -> ForkServer:
    """The session's fork server (started on first use; ended when the session's process exits)."""
    global _server
    with _server_lock:
        if _server is None or _server.proc.poll() is not None:
            _server = ForkServer()
            atexit.register(_server.close)
        return _server


if __name__ == "__main__":
    serve()
