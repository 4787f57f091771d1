"""`truestep generate CKPT --prompt TEXT`: look at what a checkpoint's model does.

Single process, CPU, KV cache. The prompt is tokenized with the checkpoint's own tokenizer (the one its
data was prepared with, or the one an imported model came with) and generation stops at its eos ids.

Exit codes: 0 success; 3 refused (checkpoint does not verify, tokenizer not found, prompt too long for
the model); 2 usage errors; 1 an I/O error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from truestep.interop.errors import InteropError


def _ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="truestep generate",
        description="Continue a prompt with a checkpoint's model (greedy by default; single process, CPU).",
    )
    parser.add_argument(
        "ckpt",
        type=Path,
        help="a step_XXXXXXXX checkpoint directory (training or imported), or a run directory / checkpoint "
        "root (newest verified)",
    )
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument(
        "--prompt", help="text, tokenized with the checkpoint's tokenizer (BOS added if it adds one)"
    )
    prompt.add_argument("--prompt-ids", type=_ids, metavar="IDS", help="raw token ids, e.g. 128000,791,6864")
    parser.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="default 64")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    parser.add_argument(
        "--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (default 1)"
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed (default 0)")
    parser.add_argument(
        "--data", type=Path, default=None, metavar="DIR", help="the data directory whose tokenizer to use"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object with ids and text")
    parser.add_argument("--no-checksums", action="store_true", help="verify sizes only, not SHA-256")
    return parser


def _run(args: argparse.Namespace) -> int:
    from truestep.interop.inference import load_checkpoint_model
    from truestep.interop.tokenizer_export import checkpoint_tokenizer
    from truestep.model.generate import Sampling, generate

    sampling = Sampling(args.max_new_tokens, args.temperature, args.top_p, args.seed)
    try:
        sampling.check()
    except ValueError as err:
        print(f"truestep generate: {err}", file=sys.stderr)
        return 2
    model, ckpt_dir = load_checkpoint_model(args.ckpt, checksums=not args.no_checksums)
    tok_info = checkpoint_tokenizer(ckpt_dir, args.data)
    tokenizer = tok_info.load() if tok_info.kind != "none" else None
    if args.prompt is not None:
        if tokenizer is None:
            raise InteropError(f"{tok_info.source} has no tokenizer files; give token ids with --prompt-ids")
        prompt_ids = (
            tokenizer.encode(args.prompt, add_special_tokens=True)
            if tok_info.kind == "hf"
            else tokenizer.encode(args.prompt)
        )
    else:
        prompt_ids = args.prompt_ids
    try:
        result = generate(model, prompt_ids, sampling, eos_ids=tok_info.eos_ids())
    except ValueError as err:
        raise InteropError(str(err)) from err
    shown = result.new_ids[:-1] if result.stop_reason == "eos" else result.new_ids
    text = tokenizer.decode(shown) if tokenizer is not None else None
    if args.json:
        record = {
            "checkpoint": str(ckpt_dir),
            "prompt_ids": result.prompt_ids,
            "new_ids": result.new_ids,
            "stop_reason": result.stop_reason,
            "text": text,
        }
        print(json.dumps(record))
    elif text is not None:
        print(text)
    else:
        print(" ".join(map(str, result.new_ids)))
    return 0


def generate_main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse printed the usage error (or --help) already
        return int(exit_.code or 0)
    try:
        return _run(args)
    except Exception as err:
        from truestep.cli.main import report

        return report("generate", err)
