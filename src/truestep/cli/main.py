"""The `truestep` command: thin subcommands that call into the rooms."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

from truestep.config.errors import ConfigError
from truestep.core.errors import expected_failure
from truestep.core.launch import Launch, LaunchError, debug_requested, request_debug

USAGE = """usage: truestep [--debug] COMMAND [ARGS]

  --debug   print the Python traceback of an error instead of its one-line message

commands:
  train [CONFIG] [--section.key=value ...]   train or resume (CONFIG: TOML file or preset; default tiny)
  launch [CONFIG] --nproc N [--max-restarts K] [overrides]   run N ranks under the local supervisor
  demo [--out DIR]                           the instrument end to end on the built-in default
  experiment [CONFIG] [--fault SPEC ...] [--campaign N] [--ablation] [--repeats K] [--out DIR]
  fidelity RUN --reference REF [--floor F ...]  trajectory fidelity of a run (exit 1: not preserving)
  goodput RUN [--reference REF [--floor F ...]]  correct goodput, badput, MTTR of a run
  report DIR                                 report.md + report.html for an experiment directory
  audit --out DIR --logs FORMAT:PATH --fault SPEC [--repeats K] [--weights PATH] -- COMMAND ARGS...
                                             does YOUR trainer resume correctly? (docs/audit.md)
  plan [--from RUN_OR_EXPERIMENT] [--config plan.toml] [--section.key=value ...]
                                             simulated goodput at a target size, and what buys it
  export CKPT --to hf|torch DEST [--dtype bf16]  consolidate a checkpoint for Hugging Face / plain torch
  import-hf HF_DIR --out CKPT_DIR            HF Llama -> truestep checkpoint (--checkpoint.init_from)
  import-torchtitan DCP_DIR --out CKPT_DIR CONFIG [--model.key=value ...]
                                             torchtitan llama3 DCP -> truestep checkpoint (q/k permuted)
  generate CKPT --prompt TEXT [--max-new-tokens N --temperature T --top-p P --seed S]
                                             continue a prompt with a checkpoint's model (KV cache, CPU)
  ckpt list|verify|inspect PATH              look at checkpoints (never unpickles)
  prepare-data INPUT... --out DIR            tokenize a corpus (.txt .jsonl[.gz|.zst] .parquet, datasets dirs)
  config [CONFIG] [--section.key=value ...]  print the resolved config as TOML
  config --reference                         print the config reference (docs/config.md)
  presets                                    list the built-in presets with their sizes
"""


def _config_main(argv: list[str]) -> int:
    from truestep.config.load import load_config, to_toml

    if argv == ["--reference"]:
        from truestep.config.reference import markdown

        print(markdown(), end="")
        return 0
    spec = argv[0] if argv and not argv[0].startswith("--") else None
    overrides = argv[1:] if spec else argv
    print(to_toml(load_config(spec, overrides)), end="")
    return 0


def _presets_main(argv: list[str]) -> int:
    from truestep.config.load import load_config, preset_names
    from truestep.model.llama import count_parameters

    for name in preset_names():
        m = load_config(name).model
        shape = f"dim {m.dim}, {m.n_layers} layers, {m.n_heads} heads ({m.n_kv_heads or m.n_heads} kv), vocab {m.vocab_size}"
        n = count_parameters(m)
        size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"
        print(f"{name:<14} {size:>7} parameters  ({shape})")
    return 0


# Each command's module is imported only when that command runs: `truestep train` stays light and
# does not depend on the analysis or interop code.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("truestep.cli.train", "train_main"),
    "launch": ("truestep.cli.launch", "launch_main"),
    "experiment": ("truestep.cli.instrument", "experiment_main"),
    "fidelity": ("truestep.cli.instrument", "fidelity_main"),
    "goodput": ("truestep.cli.instrument", "goodput_main"),
    "report": ("truestep.cli.instrument", "report_main"),
    "demo": ("truestep.cli.instrument", "demo_main"),
    "audit": ("truestep.cli.audit", "audit_main"),
    "plan": ("truestep.cli.plan", "plan_main"),
    "ckpt": ("truestep.cli.ckpt", "ckpt_main"),
    "export": ("truestep.cli.interop", "export_main"),
    "import-hf": ("truestep.cli.interop", "import_hf_main"),
    "import-torchtitan": ("truestep.cli.torchtitan", "import_torchtitan_main"),
    "generate": ("truestep.cli.generate", "generate_main"),
    "prepare-data": ("truestep.cli.prepare_data", "prepare_data_main"),
    "config": ("truestep.cli.main", "_config_main"),
    "presets": ("truestep.cli.main", "_presets_main"),
    "standby": ("truestep.cli.standby", "standby_main"),  # internal: started by `truestep launch`
}


def _command(name: str) -> Callable[[list[str]], int]:
    module, attr = COMMANDS[name]
    return getattr(importlib.import_module(module), attr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(argv) and argv[0] == "--debug"
    if debug:
        argv = argv[1:]
        request_debug()  # ranks spawned by `launch` inherit it
    debug = debug or debug_requested()
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("train", "standby"):
        # Before anything else: die with the supervisor, and catch signals during the imports (the
        # supervisor started us with them blocked: one sent since is pending, and recorded now). A parked
        # standby keeps them blocked; it captures once it is a rank (resilience/early_signals.py).
        from truestep.resilience import early_signals
        from truestep.resilience.orphan import die_with_supervisor

        die_with_supervisor(_own_launch().supervisor_pid)
        if argv[0] == "train":
            early_signals.capture()
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"truestep: unknown command {name!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return _command(name)(rest)
    except Exception as err:
        return report(name, err, debug)


def report(command: str, err: Exception, debug: bool = False) -> int:
    """Expected bad input (a TruestepError, an OSError such as a full disk): one line on stderr and the
    documented exit code (docs/resilience.md), no traceback. Anything else, or `--debug`: re-raised.
    Every rank of a torchrun job loads the same config: only rank 0 says what is wrong with it."""
    failure = expected_failure(err)
    if failure is None or debug:
        raise err
    code, line = failure
    kind = "config error: " if isinstance(err, ConfigError) else ""
    if command != "train" or _own_launch().rank == 0:
        print(f"truestep {command}: {kind}{line}", file=sys.stderr)
    return code


def _own_launch() -> Launch:
    """This process's launch record; a malformed one reads as a single process here (`truestep train`
    reads it again and refuses it, exit 2)."""
    try:
        return Launch.from_env()
    except LaunchError:
        return Launch()


if __name__ == "__main__":
    sys.exit(main())
