"""`truestep prepare-data`: the command-line front end of `prepare_data`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

from truestep.cli.main import report
from truestep.core.errors import ExitCode
from truestep.core.launch import debug_requested
from truestep.data.bos import BOS_MODES
from truestep.data.errors import DataUsageError
from truestep.data.meta import PACKINGS, read_meta
from truestep.data.shards import DEFAULT_SHARD_TOKENS, ChatOptions, PrepareProgress, prepare_data


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def default_workers() -> int:
    """Every core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (separate so the dispatcher and docs can reuse its help)."""
    p = argparse.ArgumentParser(
        prog="truestep prepare-data",
        description="Tokenize a corpus (.txt, .jsonl[.gz|.zst], .parquet, a datasets save_to_disk directory; "
        "files, directories or globs) into a data directory of token shards. Exit codes: 0 done, 2 bad "
        "arguments or inputs that cannot be read as named, 3 bad input data (one line naming file and "
        "line/row), 6 the disk refused a write, 130 interrupted (run the same command again to resume).",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files, directories or quoted globs")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output data directory")
    p.add_argument(
        "--tokenizer",
        default="byte",
        metavar="byte|PATH",
        help="'byte' (built-in) or a path to a Hugging Face tokenizer.json (default: byte)",
    )
    p.add_argument("--eos-token", default=None, metavar="TOK", help="end-of-text token of a tokenizer.json")
    p.add_argument(
        "--bos",
        choices=BOS_MODES,
        default="auto",
        help="start every document with BOS: auto follows the tokenizer (add_bos_token in "
        "tokenizer_config.json, else its post-processor; the byte tokenizer has none) (default: auto)",
    )
    p.add_argument(
        "--text-field",
        default="text",
        metavar="NAME",
        help="JSON key or Parquet/datasets column holding the text (default: text)",
    )
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        metavar="N",
        help="tokenizer processes; the output is the same for any N (default: every core)",
    )
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip bad records (and unreadable files) and count them in meta.json instead of stopping",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="start over even if an interrupted run with the same inputs and settings can be resumed",
    )
    p.add_argument(
        "--shard-tokens",
        type=_positive_int,
        default=DEFAULT_SHARD_TOKENS,
        metavar="N",
        help=f"tokens per shard file (default: {DEFAULT_SHARD_TOKENS})",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="the inputs are conversations (JSON lines with 'messages' [{role, content}] or ShareGPT "
        "'conversations' [{from, value}]): rendered with the tokenizer's chat template, the loss masked to "
        "the assistant's turns, packed whole into windows of --seq-len tokens (docs/data.md)",
    )
    p.add_argument(
        "--seq-len",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --chat: the data.seq_len you will train with (a multiple of it also works)",
    )
    p.add_argument(
        "--packing",
        choices=PACKINGS,
        default="pack",
        help="with --chat: pack conversations into windows in input order while they fit, or pad every "
        "one to a window of its own (default: pack)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _chat_options(args: argparse.Namespace) -> ChatOptions | None:
    if not args.chat:
        if args.seq_len is not None or args.packing != "pack":
            raise DataUsageError("--seq-len and --packing go with --chat")
        return None
    if args.seq_len is None:
        raise DataUsageError("--chat needs --seq-len N: the data.seq_len you will train with")
    return ChatOptions(args.seq_len, args.packing)


class _Bar:
    """Input bytes done, with documents/s and tokens/s; tqdm gives the ETA from the byte rate."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: tqdm | None = None
        self.start = time.monotonic()

    def __call__(self, p: PrepareProgress) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            self.bar = tqdm(
                total=p.total_bytes, unit="B", unit_scale=True, file=sys.stderr, dynamic_ncols=True
            )
        self.bar.update(p.done_bytes - self.bar.n)
        elapsed = max(time.monotonic() - self.start, 1e-9)
        self.bar.set_postfix_str(
            f"docs/s={p.documents / elapsed:,.0f} tok/s={p.tokens / elapsed:,.0f}", refresh=False
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def prepare_data_main(argv: list[str]) -> int:
    """Run `truestep prepare-data` with `argv` (without the program/subcommand); return exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        # argparse exits on --help (0) and on usage errors (2); the dispatcher wants a return code.
        return e.code if isinstance(e.code, int) else 2
    bar = _Bar(not args.no_progress and sys.stderr.isatty())
    try:
        out = prepare_data(
            args.inputs,
            args.out,
            tokenizer_spec=args.tokenizer,
            shard_tokens=args.shard_tokens,
            eos_token=args.eos_token,
            text_field=args.text_field,
            workers=args.workers or default_workers(),
            skip_bad=args.skip_bad,
            bos=args.bos,
            resume=not args.restart,
            progress=bar,
            log=lambda line: print(f"truestep prepare-data: {line}", file=sys.stderr),
            chat=_chat_options(args),
        )
        meta = read_meta(out)
    except KeyboardInterrupt:
        bar.close()
        print("truestep prepare-data: interrupted; run the same command again to resume", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except Exception as err:
        bar.close()
        return report("prepare-data", err, debug_requested())
    bar.close()
    skipped = sum(meta.get("skipped", {}).values())
    print(
        f"wrote {meta['num_tokens']} tokens from {meta['documents']} documents in "
        f"{len(meta['shards'])} shard(s) to {out} "
        f"(tokenizer {meta['tokenizer']}, vocab_size {meta['vocab_size']}, dtype {meta['dtype']}"
        + (f", BOS {meta['bos_id']} before each document" if meta.get("add_bos") else "")
        + (_chat_summary(meta["chat"], meta["num_tokens"]) if "chat" in meta else "")
        + (f"; skipped {skipped} bad record(s): {meta['skipped']}" if skipped else "")
        + ")"
    )
    return 0


_PACKED = {"pack": "packed into", "pad": "padded to"}


def _chat_summary(chat: dict, tokens: int) -> str:
    return (
        f"; {chat['conversations']} conversations {_PACKED[chat['packing']]} windows of {chat['seq_len']}, "
        f"loss on {chat['trained_tokens']} assistant tokens ({100 * chat['trained_tokens'] / tokens:.1f}%)"
    )
