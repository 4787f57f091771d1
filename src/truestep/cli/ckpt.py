"""`truestep ckpt list|verify|inspect`: look at checkpoints without loading (or unpickling) them.

Exit codes: 0 success; 1 `verify` found the checkpoint incomplete or corrupt; 2 usage errors (bad
arguments, a path that does not exist or is not what the subcommand expects).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from truestep.checkpoint.inspect import (
    checkpoint_root,
    inspect_checkpoint,
    is_checkpoint_dir,
    list_checkpoints,
)
from truestep.core.errors import os_error_line


class _UsageError(Exception):
    pass


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # unreachable


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="truestep ckpt",
        description="List, verify and inspect checkpoints (reads JSON and hashes files; never unpickles).",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="{list,verify,inspect}")

    p_list = sub.add_parser("list", help="checkpoints under a run directory or a checkpoint root")
    p_list.add_argument("dir", type=Path, help="run directory (holding checkpoints/) or checkpoint root")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    p_list.add_argument("--no-checksums", action="store_true", help="check sizes only (fast)")

    p_verify = sub.add_parser("verify", help="exit 0 if the checkpoint is complete, 1 (with why) if not")
    p_verify.add_argument("path", type=Path, help="a step_XXXXXXXX checkpoint directory")
    p_verify.add_argument("--no-checksums", action="store_true", help="check sizes only (fast)")

    p_inspect = sub.add_parser("inspect", help="step, layout, config fingerprint, state, files")
    p_inspect.add_argument("path", type=Path, help="a step_XXXXXXXX checkpoint directory")
    p_inspect.add_argument("--json", action="store_true", help="machine-readable output")
    p_inspect.add_argument("--no-checksums", action="store_true", help="check sizes only (fast)")
    return parser


def _checkpoint_dir(path: Path) -> Path:
    if not path.exists():
        raise _UsageError(f"{path}: no such directory")
    if not path.is_dir():
        raise _UsageError(f"{path}: not a directory")
    if not is_checkpoint_dir(path):
        hint = ""
        root = checkpoint_root(path)
        if root.is_dir() and any(is_checkpoint_dir(p) for p in root.iterdir()):
            hint = f"; to see the checkpoints under it: truestep ckpt list {path}"
        raise _UsageError(f"{path}: not a checkpoint directory (step_XXXXXXXX){hint}")
    return path


def _list(args: argparse.Namespace) -> int:
    if not args.dir.is_dir():
        raise _UsageError(f"{args.dir}: no such directory")
    root = checkpoint_root(args.dir)
    entries = list_checkpoints(root, checksums=not args.no_checksums)
    if args.json:
        print(json.dumps({"root": str(root), "checkpoints": entries}, indent=1))
        return 0
    live = [e for e in entries if not e["quarantined"]]
    quarantined = [e for e in entries if e["quarantined"]]
    if not entries:
        print(f"no checkpoints under {root}")
        return 0
    print(f"checkpoints under {root}:")
    if live:
        print(f"  {'STEP':>8}  {'STATUS':<8} {'COMMITTED':<9} {'FILES':>5} {'SIZE':>10}  NAME")
        for e in live:
            extra = " (latest hint)" if e["latest_hint"] else ""
            reason = f"  -- {e['reason']}" if e["reason"] else ""
            print(
                f"  {e['step']:>8}  {e['status']:<8} {'yes' if e['committed'] else 'no':<9} "
                f"{e['files']:>5} {_human_bytes(e['size_bytes']):>10}  {e['name']}{extra}{reason}"
            )
    else:
        print("  (none live)")
    if quarantined:
        print(f"quarantined ({len(quarantined)}, never resumed from; kept for post-mortems):")
        for e in quarantined:
            step = "?" if e["step"] is None else e["step"]
            print(f"  {step:>8}  {_human_bytes(e['size_bytes']):>10}  {e['name']}  -- {e['reason'] or '?'}")
    ok = sum(1 for e in live if e["verified"])
    how = "sizes only" if args.no_checksums else "sizes and SHA-256"
    print(f"{ok} of {len(live)} live checkpoint(s) verify ({how})")
    return 0


def _verify(args: argparse.Namespace) -> int:
    path = _checkpoint_dir(args.path)
    info = inspect_checkpoint(path, checksums=not args.no_checksums)
    if info["quarantined"]:
        # Moving it aside is what its marker now disagrees with; what matters is why it was moved.
        why = info["quarantine_reason"] or "no reason recorded"
        now = f"FAILED: {info['reason']}" if not info["verified"] else "it verifies as it is now"
        print(
            f"truestep ckpt verify: {path} (quarantined): set aside because: {why}; never resumed from "
            f"(checked now: {now})",
            file=sys.stderr,
        )
        return 1
    if not info["verified"]:
        print(f"truestep ckpt verify: {path}: FAILED: {info['reason']}", file=sys.stderr)
        return 1
    how = "sizes only; checksums not checked" if args.no_checksums else "sizes and SHA-256"
    print(f"OK {path}: step {info['step']}, {info['files']} files, {info['total_bytes']} bytes ({how})")
    return 0


def _fmt_time(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "?"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _fmt_mapping(mapping: Any) -> str:
    if not isinstance(mapping, dict):
        return "?"
    return " ".join(f"{k}={v}" for k, v in mapping.items())


def _inspect(args: argparse.Namespace) -> int:
    path = _checkpoint_dir(args.path)
    info = inspect_checkpoint(path, checksums=not args.no_checksums)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    how = "sizes only" if args.no_checksums else "sizes and SHA-256"
    status = f"verified ({how})" if info["verified"] else f"NOT VERIFIED: {info['reason']}"
    if info["quarantined"]:
        status = f"quarantined; {status}"
    marker = info["marker"]
    committed = "no"
    if info["committed"] and marker:
        sha = str(marker.get("manifest_sha256", "?"))[:16]
        committed = f"yes, at {_fmt_time(marker.get('committed_at'))} (manifest sha256 {sha}...)"
    elif info["committed"]:
        committed = "marker present but unreadable"
    manifest = (
        f", manifest lists {info['manifest_files']} ({info['manifest_bytes']} bytes)"
        if info["manifest_files"] is not None
        else ", no manifest"
    )
    train_state = info["train_state"]
    rows = [
        ("checkpoint", info["path"]),
        ("step", "?" if info["step"] is None else info["step"]),
        ("status", status),
        ("committed", committed),
        ("layout", _fmt_mapping(info["layout"]) if info["layout"] else "?"),
        ("rank files", f"{len(info['rank_files'])} ({', '.join(info['rank_files']) or 'none'})"),
        ("config", f"fingerprint {info['config_fingerprint'] or '?'}"),
        ("train_state", _fmt_mapping(train_state) if train_state else "?"),
        ("data", _fmt_mapping(info["data_position"]) if info["data_position"] else "?"),
        ("files", f"{info['files']} files, {info['total_bytes']} bytes on disk{manifest}"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    for problem in info["problems"]:
        print(f"{'problem':<{width}}  {problem}")
    return 0


def ckpt_main(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse already printed the usage error to stderr
        return int(exit_.code or 0)
    action = {"list": _list, "verify": _verify, "inspect": _inspect}[args.action]
    try:
        return action(args)
    except _UsageError as err:
        print(f"truestep ckpt {args.action}: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # e.g. permission denied: one line, still a usage-level error here
        print(f"truestep ckpt {args.action}: {os_error_line(err)}", file=sys.stderr)
        return 2
