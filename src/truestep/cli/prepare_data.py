"""`truestep prepare-data`: the command-line front end of `prepare_data`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from truestep.data.errors import DataError
from truestep.data.meta import read_meta
from truestep.data.shards import DEFAULT_SHARD_TOKENS, prepare_data


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (separate so the dispatcher and docs can reuse its help)."""
    p = argparse.ArgumentParser(
        prog="truestep prepare-data",
        description="Tokenize text files (one document each, EOS after each) into a data directory.",
    )
    p.add_argument("text_files", nargs="+", type=Path, metavar="TEXT_FILES", help="UTF-8 text files")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output data directory")
    p.add_argument(
        "--tokenizer",
        default="byte",
        metavar="byte|PATH",
        help="'byte' (built-in) or a path to a Hugging Face tokenizer.json (default: byte)",
    )
    p.add_argument("--eos-token", default=None, metavar="TOK", help="end-of-text token of a tokenizer.json")
    p.add_argument(
        "--shard-tokens",
        type=_positive_int,
        default=DEFAULT_SHARD_TOKENS,
        metavar="N",
        help=f"tokens per shard file (default: {DEFAULT_SHARD_TOKENS})",
    )
    return p


def prepare_data_main(argv: list[str]) -> int:
    """Run `truestep prepare-data` with `argv` (without the program/subcommand); return exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        # argparse exits on --help (0) and on usage errors (2); the dispatcher wants a return code.
        return e.code if isinstance(e.code, int) else 2
    try:
        out = prepare_data(
            args.text_files,
            args.out,
            tokenizer_spec=args.tokenizer,
            shard_tokens=args.shard_tokens,
            eos_token=args.eos_token,
        )
        meta = read_meta(out)
    except (DataError, OSError) as e:
        print(f"truestep prepare-data: error: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote {meta['num_tokens']} tokens from {meta['documents']} documents in "
        f"{len(meta['shards'])} shard(s) to {out} "
        f"(tokenizer {meta['tokenizer']}, vocab_size {meta['vocab_size']}, dtype {meta['dtype']})"
    )
    return 0
