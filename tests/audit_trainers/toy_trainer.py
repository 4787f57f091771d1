"""A plain-Python trainer (no torch: it starts in milliseconds) for the `truestep audit` tests that are
about the audit itself rather than a framework: linear regression by SGD with momentum on a seeded
stream, a JSON-lines log, a checkpoint every few steps (written atomically), final weights as
safetensors. Started again on the same directory it resumes from its checkpoint.

Switches that break it the ways the audit must report:
  --no-resume        a restart ignores the checkpoint and starts over from step 1
  --skip-steps 5,6   those steps are never logged
  --lose-momentum    a resume restores the weights but not the momentum (an optimizer state not restored)
  --fail-on-resume   a restart crashes (exit 1) whenever a checkpoint exists: it never resumes
  --noise            gradients carry run-to-run noise (a trainer that is not bitwise deterministic)
  --round D          the loss is logged rounded to D decimals
  --ignore-term      SIGTERM is ignored (a job that does not stop when preempted)
  --crash-once-at N  the first run to reach step N exits 1 there (a crash no fault injected)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import struct
import sys
import time
from pathlib import Path

DIM, BATCH = 4, 8


def sample(index: int) -> tuple[list[float], float]:
    """Sample `index` of the data stream: a pure function of the index (the data position is the step)."""
    state = (index * 6364136223846793005 + 1442695040888963407) % 2**64
    xs = []
    for _ in range(DIM):
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        xs.append((state >> 11) / 2**53 * 2 - 1)
    y = sum((k + 1) * x for k, x in enumerate(xs)) + 0.5
    return xs, y


def step_once(w: list[float], m: list[float], step: int, lr: float, noise: bool) -> tuple[float, float]:
    grad, loss = [0.0] * (DIM + 1), 0.0
    for i in range(BATCH):
        xs, y = sample(step * BATCH + i)
        err = sum(wk * xk for wk, xk in zip(w, xs, strict=False)) + w[DIM] - y
        loss += err * err / BATCH
        for k in range(DIM):
            grad[k] += 2 * err * xs[k] / BATCH
        grad[DIM] += 2 * err / BATCH
    if noise:
        jitter = int.from_bytes(os.urandom(4), "little") / 2**32 - 0.5
        grad = [g * (1 + 1e-9 * jitter) for g in grad]
    norm = math.sqrt(sum(g * g for g in grad))
    for k in range(DIM + 1):
        m[k] = 0.9 * m[k] + grad[k]
        w[k] -= lr * m[k]
    return loss, norm


def save_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def save_safetensors(path: Path, w: list[float]) -> None:
    header = json.dumps({"w": {"dtype": "F64", "shape": [len(w)], "data_offsets": [0, 8 * len(w)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack(f"<{len(w)}d", *w))


EXTRA_FLAGS = "AUDIT_TEST_FLAGS"
"""More flags from the environment: the tests give them to the faulted run only (the audit's
fingerprint is its command line, so the failure-free runs stay comparable)."""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--skip-steps", default="")
    p.add_argument("--lose-momentum", action="store_true")
    p.add_argument("--fail-on-resume", action="store_true")
    p.add_argument("--noise", action="store_true")
    p.add_argument("--round", type=int)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--crash-once-at", type=int)
    a = p.parse_args(sys.argv[1:] + os.environ.get(EXTRA_FLAGS, "").split())
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    run = Path(a.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    ckpt, skip = run / "ckpt.json", {int(s) for s in a.skip_steps.split(",") if s}
    w, m, step = [0.0] * (DIM + 1), [0.0] * (DIM + 1), 0
    if ckpt.exists() and a.fail_on_resume:
        raise SystemExit("toy trainer: --fail-on-resume")
    if ckpt.exists() and not a.no_resume:
        state = json.loads(ckpt.read_text())
        w, step = state["w"], state["step"]
        m = [0.0] * (DIM + 1) if a.lose_momentum else state["m"]
    with open(run / "log.jsonl", "a") as log:
        while step < a.steps:
            lr = 0.05 * (1 - step / a.steps)
            loss, norm = step_once(w, m, step, lr, a.noise)
            step += 1
            if a.round is not None:
                loss = round(loss, a.round)
            if step % a.save_every == 0:  # before the step is logged: a logged step is a saved one
                save_json(ckpt, {"step": step, "w": w, "m": m})
            crashed = run / "crashed-once"
            if step == a.crash_once_at and not crashed.exists():
                crashed.write_text("")
                raise SystemExit(1)
            if step not in skip:
                line = {"step": step, "loss": loss, "grad_norm": norm, "lr": lr, "time": time.time()}
                log.write(json.dumps(line) + "\n")
                log.flush()
            time.sleep(a.sleep)
    save_safetensors(run / "final.safetensors", w)


if __name__ == "__main__":
    main()
