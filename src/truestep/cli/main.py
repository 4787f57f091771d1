"""The `truestep` command: thin subcommands that call into the rooms."""

from __future__ import annotations

import sys
from collections.abc import Callable

from truestep.config.load import ConfigError

USAGE = """usage: truestep COMMAND [ARGS]

commands:
  train [CONFIG] [--section.key=value ...]   train or resume (CONFIG: TOML file or preset; default tiny)
  launch [CONFIG] --nproc N [--max-restarts K] [overrides]   run N ranks under the local supervisor
  demo [--out DIR]                           the instrument end to end on the built-in default
  experiment [CONFIG] [--fault SPEC ...] [--campaign N] [--ablation] [--out DIR]
  fidelity RUN --reference REF [--floor REF2]  trajectory fidelity of a run
  goodput RUN [--reference REF]              correct goodput, badput, MTTR of a run
  report DIR                                 report.md + report.html for an experiment directory
  prepare-data FILES... --out DIR            tokenize text files into token shards
  config [CONFIG] [--section.key=value ...]  print the resolved config as TOML
  config --reference                         print the config reference (docs/config.md)
  presets                                    list the built-in presets
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
    from truestep.config.load import preset_names

    print("\n".join(preset_names()))
    return 0


def _commands() -> dict[str, Callable[[list[str]], int]]:
    from truestep.cli.instrument import demo_main, experiment_main, fidelity_main, goodput_main, report_main
    from truestep.cli.launch import launch_main
    from truestep.cli.train import train_main
    from truestep.data.cli import prepare_data_main

    return {
        "train": train_main,
        "launch": launch_main,
        "experiment": experiment_main,
        "fidelity": fidelity_main,
        "goodput": goodput_main,
        "report": report_main,
        "demo": demo_main,
        "prepare-data": prepare_data_main,
        "config": _config_main,
        "presets": _presets_main,
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    commands = _commands()
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"truestep: unknown command {name!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return commands[name](rest)
    except ConfigError as err:
        print(f"truestep {name}: config error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
