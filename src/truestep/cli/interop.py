"""`truestep export CKPT --to hf|torch DEST` and `truestep import-hf HF_DIR --out CKPT_DIR`.

Exit codes: 0 success; 3 refused (checkpoint does not verify, unsupported architecture or config,
weights that do not fit, destination exists); 2 usage errors; 6 the filesystem refused a write (full,
read-only); 1 another I/O error. Every expected error is one line on stderr (cli/main.py `report`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from truestep.interop.dtypes import EXPORT_DTYPES
from truestep.interop.errors import InteropError

USAGE = """usage:
  truestep export CKPT --to hf OUT_DIR [--dtype fp32|bf16|fp16] [--max-shard-size 5GB]
                  [--data DIR | --no-tokenizer] [--no-checksums]
  truestep export CKPT --to torch FILE [--dtype fp32|bf16|fp16] [--no-checksums]
  truestep import-hf HF_DIR|models--ORG--NAME|ORG/NAME --out CKPT_DIR [--dtype bf16|fp32]
                     [--revision REV] [--cache-dir DIR]
"""
IMPORT_DTYPES = ("bf16", "fp32")


def _export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="truestep export",
        description="Consolidate the model weights of a verified checkpoint (any layout) into a Hugging Face "
        "Llama directory (config.json, safetensors, tokenizer, generation_config.json) or a single "
        "torch.save state dict.",
    )
    parser.add_argument(
        "ckpt",
        type=Path,
        help="a step_XXXXXXXX checkpoint directory, or a run directory / checkpoint root (newest verified)",
    )
    parser.add_argument("--to", required=True, choices=("hf", "torch"), help="output format")
    parser.add_argument("dest", type=Path, help="hf: output directory (new or empty); torch: output file")
    parser.add_argument(
        "--max-shard-size",
        default="5GB",
        help="hf: split the safetensors into shards of at most this size (5GB, 500MB, 2GiB; default 5GB)",
    )
    parser.add_argument(
        "--dtype",
        default="fp32",
        choices=tuple(EXPORT_DTYPES),
        help="dtype of the written weights (default fp32, truestep's master weights; bf16 halves the size)",
    )
    tokenizer = parser.add_mutually_exclusive_group()
    tokenizer.add_argument(
        "--data",
        type=Path,
        default=None,
        metavar="DIR",
        help="hf: the data directory whose tokenizer to export (default: the run's data.path, or the "
        "tokenizer an imported checkpoint carries)",
    )
    tokenizer.add_argument(
        "--no-tokenizer", action="store_true", help="hf: export the weights without tokenizer files or ids"
    )
    parser.add_argument("--no-checksums", action="store_true", help="verify sizes only, not SHA-256")
    return parser


def _import_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="truestep import-hf",
        description="Turn a Hugging Face LlamaForCausalLM directory (safetensors) into a weights-only truestep "
        "checkpoint that a fresh run starts from with --checkpoint.init_from=CKPT_DIR.",
    )
    parser.add_argument(
        "hf_dir",
        help="directory with config.json and *.safetensors, a Hugging Face cache folder models--org--name, "
        "or a repo id org/name looked up in the cache (offline)",
    )
    parser.add_argument(
        "--revision",
        default=None,
        help="cache: the snapshot to import (a branch or tag in refs/, or a commit; default: refs/main, "
        "else the only or newest snapshot)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="cache: the hub cache root for a repo id (default: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)",
    )
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help="checkpoint root (step_00000000/ is created in it) or a step_XXXXXXXX directory; must be new or empty",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=IMPORT_DTYPES,
        help="dtype the weights are stored in (default: as the source stores them; training casts them to "
        "its fp32 master weights either way)",
    )
    return parser


def _export(argv: list[str]) -> int:
    from truestep.interop.hf import export_hf
    from truestep.interop.torch_file import export_torch

    args = _export_parser().parse_args(argv)
    checksums = not args.no_checksums
    dtype = EXPORT_DTYPES[args.dtype]
    if args.to == "hf":
        info = export_hf(
            args.ckpt,
            args.dest,
            args.max_shard_size,
            checksums=checksums,
            dtype=dtype,
            data_dir=args.data,
            with_tokenizer=not args.no_tokenizer,
        )
        print(
            f"exported {info['checkpoint']} -> {info['out']}: {info['tensors']} tensors, "
            f"{info['bytes']} bytes in {len(info['files'])} file(s) ({info['dtype']})"
        )
        if info["tokenizer"] is None:
            print("no tokenizer exported (--no-tokenizer): bos/eos/pad_token_id are null in config.json")
        else:
            print(f"tokenizer from {info['tokenizer']}: {', '.join(info['tokenizer_files']) or 'ids only'}")
    else:
        if args.data is not None or args.no_tokenizer:
            raise InteropError("--data and --no-tokenizer apply to --to hf only (a torch file holds weights)")
        info = export_torch(args.ckpt, args.dest, checksums=checksums, dtype=dtype)
        print(f"exported {info['checkpoint']} -> {info['file']}: {info['tensors']} tensors ({info['dtype']})")
    return 0


def _import(argv: list[str]) -> int:
    from truestep.interop.hf import describe_model, import_hf
    from truestep.interop.train_config import write_train_config

    args = _import_parser().parse_args(argv)
    from truestep.interop.hf_cache import resolve_model_dir

    hf_dir, picked = resolve_model_dir(args.hf_dir, args.revision, args.cache_dir)
    if picked is not None:
        print(f"{args.hf_dir}: {picked}")
    dtype = EXPORT_DTYPES[args.dtype] if args.dtype else None
    info = import_hf(hf_dir, args.out, dtype=dtype)
    print(f"imported {info['hf_dir']} -> {info['checkpoint']}: {describe_model(info['model'])}")
    stored = str(dtype).removeprefix("torch.") if dtype is not None else "as the source"
    print(f"source dtypes: {', '.join(info['source_dtypes'])} (stored {stored})")
    ids = ", ".join(f"{key}={value}" for key, value in info["special_tokens"].items())
    print(f"tokenizer: {', '.join(info['tokenizer_files']) or 'none in the source directory'}; {ids}")
    if info["tokenizer_left_out"]:
        print(
            f"not kept: {', '.join(info['tokenizer_left_out'])} beside the model, without the tokenizer.json "
            "they belong to (copy that tokenizer.json beside them and import again to keep them)"
        )
    written = write_train_config(Path(args.out), info["model"], str(args.hf_dir))
    print(f"wrote {written}: the model settings and checkpoint.init_from; fine-tune it with")
    print(f"  truestep train {written} --data.path=DIR --run.dir=runs/NAME")
    return 0


def interop_main(argv: list[str]) -> int:
    """Entry point for both subcommands: argv[0] is "export" or "import-hf"."""
    if not argv or argv[0] not in ("export", "import-hf"):
        print(USAGE, file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    from truestep.cli.main import report

    try:
        return _export(rest) if name == "export" else _import(rest)
    except SystemExit as exit_:  # argparse printed the usage error (or --help) already
        return int(exit_.code or 0)
    except Exception as err:
        return report(name, err)


if __name__ == "__main__":
    sys.exit(interop_main(sys.argv[1:]))


def export_main(argv: list[str]) -> int:
    """`truestep export ...`"""
    return interop_main(["export", *argv])


def import_hf_main(argv: list[str]) -> int:
    """`truestep import-hf ...`"""
    return interop_main(["import-hf", *argv])
