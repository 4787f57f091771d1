"""Fault injection only when asked: the explicit opt-in for TRUESTEP_FAULTS, and the banner.

A TRUESTEP_FAULTS left in a shell (or exported by a wrapper script) would otherwise arm fault injection
in an ordinary launch with nothing said: a `corrupt` fault damaging its newest checkpoint while the run
exits 0. So the process that reads the user's environment (`truestep launch`, an unsupervised
`truestep train`, a torchrun worker) arms faults from it only with `--allow-env-faults` or
`run.allow_env_faults = true`, and refuses otherwise (exit 2, one line). Faults given with `--fault`
are asked for explicitly and need no opt-in. Whenever anything is armed, a banner on stderr says so
(and the trainer lists the armed faults in `run_start`). A supervised rank's faults were put in its
launch record by its supervisor, which already applied this rule.
"""

from __future__ import annotations

import sys

from truestep.core.errors import UsageError
from truestep.core.launch import Launch
from truestep.core.names import ENV_FAULTS
from truestep.faults.spec import parse_faults

ALLOW_FLAG = "--allow-env-faults"


class EnvFaultsRefused(UsageError):
    """TRUESTEP_FAULTS is set but fault injection from the environment was not asked for (exit 2)."""


def faults_to_arm(launch: Launch, cli_faults: list[str], allowed: bool, prog: str) -> Launch:
    """`launch` with `cli_faults` added, after refusing environment faults nobody opted in to; prints
    the banner when anything ends up armed. Parses every spec (a bad one is a one-line error here)."""
    if launch.faults and not launch.supervised and not allowed:
        raise EnvFaultsRefused(
            f"{ENV_FAULTS}={launch.faults!r} is set, but fault injection from the environment needs "
            f"{ALLOW_FLAG} (or run.allow_env_faults=true); unset {ENV_FAULTS} for an ordinary run"
        )
    armed = launch.with_faults(cli_faults)
    specs = parse_faults(armed.faults)
    if specs and not launch.supervised and launch.rank == 0:
        listed = "; ".join(spec.text for spec in specs)
        print(f"{prog}: FAULT INJECTION ARMED: {listed}", file=sys.stderr, flush=True)
    return armed
