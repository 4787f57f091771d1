"""The resume journal of an interrupted `prepare-data`: where the last complete shard ends in the input.

Written (atomically) after every shard; removed once meta.json marks the directory complete. It records
the settings the run was started with (inputs with their sizes and modification times, tokenizer, text
field, BOS, shard size, --skip-bad), the shards written, and the reading position at which the next shard
begins: a chunk cursor, the tokens of that chunk already in shards, and the counters before that chunk.
A run with the same settings continues from there; any difference starts over.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from truestep.data.atomic import atomic_write_bytes
from truestep.data.meta import JOURNAL_NAME, SHARD_RE, sha256_file
from truestep.data.readers import Cursor

JOURNAL_FORMAT = "truestep-prepare-journal"


@dataclass
class Counters:
    """Documents and skipped records, summed over whole chunks."""

    documents: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)


@dataclass
class Journal:
    settings: dict[str, Any]
    shards: list[dict[str, Any]]
    cursor: Cursor
    skip_tokens: int
    counters: Counters


def settings_digest(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def write_journal(out_dir: Path, journal: Journal) -> None:
    record = {
        "format": JOURNAL_FORMAT,
        "settings_sha256": settings_digest(journal.settings),
        "settings": journal.settings,
        "shards": journal.shards,
        "cursor": asdict(journal.cursor),
        "skip_tokens": journal.skip_tokens,
        "counters": asdict(journal.counters),
    }
    atomic_write_bytes(out_dir / JOURNAL_NAME, json.dumps(record).encode("utf-8"))


def read_journal(out_dir: Path, settings: dict[str, Any]) -> tuple[Journal | None, str]:
    """The journal in `out_dir` if it belongs to a run with `settings` and its shards are intact, else
    (None, why not)."""
    path = out_dir / JOURNAL_NAME
    if not path.is_file():
        return None, "no interrupted run"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record["format"] != JOURNAL_FORMAT:
            return None, "not a prepare-data journal"
        if record["settings_sha256"] != settings_digest(settings):
            return None, "the inputs or settings differ from the interrupted run's"
        shards = record["shards"]
        for entry in shards:
            name = entry["file"]
            if not isinstance(name, str) or not SHARD_RE.fullmatch(name):
                return None, f"journal names {name!r}"
            shard = out_dir / name
            if shard.is_symlink() or not shard.is_file() or sha256_file(shard) != entry["sha256"]:
                return None, f"{name} is missing or differs from the journal"
        cursor = Cursor(**record["cursor"])
        counters = Counters(**record["counters"])
        skip = int(record["skip_tokens"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"unreadable journal ({type(e).__name__}: {e})"
    return Journal(settings, shards, cursor, skip, counters), "resuming"
