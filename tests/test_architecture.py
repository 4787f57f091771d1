"""The house rules of docs/architecture.md, checked from the source: rooms import downward only, and
every run-directory name, checkpoint file name, rank-state key and TRUESTEP_* variable is spelled by
its owner alone (everyone else imports the constant)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "truestep"

# Tiers from the bottom up: a room may import its own modules and rooms of lower tiers only.
TIERS = [
    {"core", "presets"},
    {"config"},
    {"model", "data", "faults"},
    {"parallel"},
    {"telemetry"},
    {"resilience"},
    {"checkpoint", "supervisor"},
    {"train", "interop"},
    {"analysis"},
    {"experiment", "audit"},
    {"plan"},
    {"cli"},
]
TIER = {room: i for i, rooms in enumerate(TIERS) for room in rooms}

# name -> the modules allowed to spell it (relative to src/truestep).
OWNED = {
    **dict.fromkeys(
        ["metrics.jsonl", "events.jsonl", "config.toml", "heartbeats", "lease.json", "attempts", "tb"],
        {"core/names.py"},
    ),
    "checkpoints": {"core/names.py"},
    **dict.fromkeys(
        ["COMMITTED", "manifest.json", "latest", "quarantine", "superseded"], {"checkpoint/catalog.py"}
    ),
    "interop.json": {"checkpoint/weights.py"},
    "save.json": {"checkpoint/catalog.py"},
    **dict.fromkeys(["train_state", "loader", "rng"], {"checkpoint/state.py"}),
    **dict.fromkeys(["config_keys", "config_fingerprint"], {"checkpoint/state.py", "checkpoint/weights.py"}),
}
# Same spelling, different meaning: (module, string) pairs that are not the owned name.
NOT_THE_OWNED_NAME = {
    ("faults/spec.py", "latest"): "the value of a corrupt fault's target= field",
    ("cli/ckpt.py", "checkpoints"): "a key of `ckpt list --json` output",
    ("cli/ckpt.py", "COMMITTED"): "a column header of `ckpt list`",
    ("cli/ckpt.py", "config_fingerprint"): "a key of `ckpt inspect --json` output",
    ("cli/ckpt.py", "train_state"): "a key of `ckpt inspect --json` output",
    ("checkpoint/inspect.py", "train_state"): "a key of `ckpt inspect --json` output",
    ("checkpoint/inspect.py", "config_keys"): "a key of `ckpt inspect --json` output",
    ("checkpoint/inspect.py", "config_fingerprint"): "a key of `ckpt inspect --json` output",
    ("analysis/runlog.py", "config_fingerprint"): "a field of the run_start event (train/trainer.py)",
}


def modules() -> list[tuple[str, ast.Module]]:
    found = [(str(p.relative_to(SRC)), ast.parse(p.read_text())) for p in sorted(SRC.rglob("*.py"))]
    assert len(found) > 50, f"found only {len(found)} modules under {SRC}: the checks below would be vacuous"
    return found


def room_of(module: str) -> str | None:
    parts = module.split("/")
    return parts[0] if len(parts) > 1 else None


def imported_rooms(tree: ast.Module) -> set[str]:
    """Every truestep room a module imports, anywhere in it (TYPE_CHECKING and local imports too)."""
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "truestep" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_room_has_a_tier() -> None:
    rooms = {room_of(m) for m, _ in modules()} - {None}
    assert rooms <= set(TIER), f"rooms missing from TIERS (and docs/architecture.md): {rooms - set(TIER)}"


def test_rooms_import_downward_only() -> None:
    upward = []
    for module, tree in modules():
        room = room_of(module)
        if room is None:
            continue
        for other in imported_rooms(tree) - {room}:
            if other in TIER and TIER[other] >= TIER[room]:
                upward.append(f"{module} imports truestep.{other}")
    assert upward == [], "imports against the room order of docs/architecture.md:\n" + "\n".join(upward)


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
        if isinstance(node, ast.ClassDef | ast.Module):  # attribute docstrings: a string after a statement
            for stmt in node.body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    ids.add(id(stmt.value))
    return ids


def test_names_are_spelled_only_by_their_owner() -> None:
    strays = []
    for module, tree in modules():
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skip:
                continue
            value = node.value
            if value in OWNED and module not in OWNED[value] and (module, value) not in NOT_THE_OWNED_NAME:
                strays.append(f"{module}:{node.lineno}: {value!r} (owner: {', '.join(sorted(OWNED[value]))})")
            if value.startswith("TRUESTEP_") and module != "core/names.py":
                strays.append(f"{module}:{node.lineno}: {value!r} (owner: core/names.py)")
    assert strays == [], "spell these through their owner's constant:\n" + "\n".join(strays)


# The ablation switches: "be wrong this way" variants (docs/checkpointing.md). Read as config attributes
# only where the variant is chosen; plan/ has a model of its own with fields of the same names.
ABLATION_SWITCHES = {
    "atomic_commit",
    "restore_optimizer_state",
    "restore_rng_state",
    "restore_data_position",
    "emulate_unstaged_async_save",
    "verify_restored_digest",
}
CHOOSES_THE_VARIANT = {"checkpoint/mechanisms.py"}
OWN_MODEL_OF_THE_MECHANISMS = "plan/"


def test_ablation_switches_are_read_only_where_the_variant_is_chosen() -> None:
    """No correct code path asks which variant it runs: `checkpoint/mechanisms.py` reads the switches and
    hands out classes (an `if atomic_commit` inside the correct code is how an ablation leaks into it)."""
    readers = []
    for module, tree in modules():
        if module in CHOOSES_THE_VARIANT or module.startswith(OWN_MODEL_OF_THE_MECHANISMS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ABLATION_SWITCHES:
                readers.append(f"{module}:{node.lineno}: .{node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr":
                args = node.args
                if len(args) > 1 and isinstance(args[1], ast.Constant) and args[1].value in ABLATION_SWITCHES:
                    readers.append(f"{module}:{node.lineno}: getattr(..., {args[1].value!r})")
    assert readers == [], "read the ablation switches only in checkpoint/mechanisms.py:\n" + "\n".join(
        readers
    )


def _hook_classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for module, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "Hook" for b in node.bases):
                found.append((module, node))
    return found


def test_no_hook_holds_another_hook() -> None:
    """A hook receives what it needs from the loop (the Start / Restored value, a StepView) or shares an
    output object; it never takes another hook, so the order of hooks is only `Slot`'s to say."""
    hooks = _hook_classes()
    assert len(hooks) >= 7, f"found only {len(hooks)} hooks: the check below would be vacuous"
    names = {node.name for _, node in hooks} | {"Hook"}
    holding = []
    for module, node in hooks:
        for inner in ast.walk(node):
            if isinstance(inner, ast.arg) and inner.annotation is not None:
                mentioned = {n.id for n in ast.walk(inner.annotation) if isinstance(n, ast.Name)}
                text = ast.unparse(inner.annotation)
                if mentioned & names or any(name in text for name in names - {"Hook"}):
                    holding.append(f"{module}: {node.name} takes {inner.arg}: {text}")
        slots = [
            stmt
            for stmt in node.body
            if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", "") == "slot"
        ]
        if not slots:
            holding.append(f"{module}: {node.name} declares no slot (train/hooks/base.py Slot)")
    assert holding == [], "\n".join(holding)
