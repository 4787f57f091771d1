"""`truestep import-torchtitan DCP_DIR --out CKPT_DIR CONFIG [--model.key=value ...]`.

A separate command, not an `import-hf` option: the source is a DCP directory, not a Hugging Face one,
and it records no model config, so the model is given as for `truestep train` (a preset or TOML file
plus overrides; only the [model] section is used).

Exit codes: 0 success; 3 refused (not a torchtitan llama checkpoint, shapes that do not fit the given
model, unsafe metadata, destination not empty); 2 usage and config errors; 6 the filesystem refused a
write; 1 another I/O error.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="truestep import-torchtitan",
        description="Turn a torchtitan llama3 DCP checkpoint into a weights-only truestep checkpoint, permuting "
        "the q/k projections from torchtitan's interleaved RoPE pairs to truestep's half-split layout.",
    )
    parser.add_argument("dcp_dir", type=Path, help="a torchtitan checkpoint step directory (holds .metadata)")
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help="checkpoint root (step_00000000/ is created in it) or a step_XXXXXXXX directory; must be new or empty",
    )
    parser.add_argument(
        "config",
        help="preset or TOML file with the model's shape (e.g. llama3.1-8b for torchtitan's 8B flavor)",
    )
    return parser


def import_torchtitan_main(argv: list[str]) -> int:
    from truestep.cli.main import report
    from truestep.config.load import load_config
    from truestep.interop.torchtitan import import_torchtitan

    try:
        args, overrides = _parser().parse_known_args(argv)
    except SystemExit as exit_:  # argparse printed the usage error (or --help) already
        return int(exit_.code or 0)
    cfg = load_config(args.config, overrides).model  # a ConfigError becomes exit 2 in cli/main.py
    try:
        info = import_torchtitan(args.dcp_dir, args.out, cfg)
    except Exception as err:
        return report("import-torchtitan", err)
    print(
        f"imported {info['dcp_dir']} -> {info['checkpoint']}: {info['tensors']} tensors "
        f"(keys {'under model.' if info['key_prefix'] else 'flat'}; {', '.join(info['source_dtypes'])} "
        "stored as float32; q/k permuted to half-split RoPE)"
    )
    print("start a run from it with these model settings:")
    print(f"  --checkpoint.init_from={args.out} " + " ".join(info["model_overrides"]))
    return 0
