"""The resume journal of an interrupted `prepare-data`: where the last complete shard ends in the input.

Written (atomically) after every shard; removed once meta.json marks the directory complete. It records
the settings the run was started with (inputs with their sizes and modification times, tokenizer, text
field, BOS, shard size, --skip-bad), the shards written, and the reading position at which the next shard
begins: a chunk cursor, the tokens of that chunk already in shards, and the counters before that chunk.
A run with the same settings continues from there; any difference starts over.

The journal is a claim, not an authority (anyone who can write the directory can forge one, and a
forged cursor once yielded a silently wrong dataset with exit 0). So it is checked against what it
claims before anything is resumed: every field has its type and range, the shards it lists are the
consecutive shard files with the digest and token count it says, their EOS tokens are at least the
documents it counts, and the position it names is where those shards end -- the chunk there, encoded
again, begins with exactly the `skip_tokens` tokens the shards end with (`tail_problem`; for chat data
the masks too, packed from the block fill the counters record). A journal that fails any of it is not
used: the run starts over, and says why in one line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from truestep.core.fsio import OversizeFileError, read_regular
from truestep.core.outside import OutsideJsonError, loads_bounded
from truestep.data.atomic import atomic_write_bytes
from truestep.data.meta import JOURNAL_NAME, mask_name, sha256_file, shard_name
from truestep.data.readers import Cursor

JOURNAL_FORMAT = "truestep-prepare-journal"
JOURNAL_LIMIT = 64 << 20
"""A journal lists its shards in ~150 bytes each: 64 MiB is hundreds of thousands of them."""


class _Forged(ValueError):
    """The journal says something that is not so (or not of its type)."""


def _int(value: Any, what: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _Forged(f"{what} is {str(value)[:40]!r}, not an integer >= {low}")
    return value


@dataclass
class Counters:
    """Documents and skipped records, summed over whole chunks."""

    documents: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    block_fill: int = 0
    """Chat data: tokens in the packer's current block (data/packing.py) before the chunk."""


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
    """The journal in `out_dir` if it belongs to a run with `settings`, its fields are what they must be,
    and the shards it lists are there as it says (`tail_problem` then checks the position), else
    (None, why not)."""
    path = out_dir / JOURNAL_NAME
    if not path.is_file():
        return None, "no interrupted run"
    try:
        record = loads_bounded(read_regular(path, JOURNAL_LIMIT), str(path))
        if not isinstance(record, dict) or record.get("format") != JOURNAL_FORMAT:
            return None, "not a prepare-data journal"
        if record.get("settings_sha256") != settings_digest(settings):
            return None, "the inputs or settings differ from the interrupted run's"
        shards = _shards(out_dir, record.get("shards"), settings)
        cursor = _cursor(record.get("cursor"), len(settings["inputs"]))
        counters = _counters(record.get("counters"), settings.get("chat"))
        skip = _int(record.get("skip_tokens"), "skip_tokens", low=1)
        eos = sum(entry.pop("eos") for entry in shards)
        if counters.documents > eos:
            raise _Forged(f"it counts {counters.documents} documents, but its shards end only {eos}")
    except _Forged as e:
        return None, f"the journal does not hold: {e}"
    except (OSError, OutsideJsonError, OversizeFileError) as e:
        return None, f"unreadable journal ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    return Journal(settings, shards, cursor, skip, counters), "resuming"


def _shards(out_dir: Path, shards: Any, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The listed shards, each checked against its file: the names consecutive from shard_00000, the
    digest and token count as listed. Each entry gets its EOS count (`eos`, taken off by the caller)."""
    if not isinstance(shards, list) or not shards:
        raise _Forged("it lists no shards")
    checked = []
    chat = settings.get("chat") is not None
    keys = {"file", "num_tokens", "sha256"} | ({"mask", "mask_sha256"} if chat else set())
    for index, entry in enumerate(shards):
        if not isinstance(entry, dict) or set(entry) != keys:
            raise _Forged(f"shard entry {index} is not {', '.join(sorted(keys))}")
        name = shard_name(index)
        if entry["file"] != name:
            raise _Forged(f"shard entry {index} names {str(entry['file'])[:40]!r}, not {name}")
        tokens = _int(entry["num_tokens"], f"{name}'s token count", low=1)
        if tokens != settings["shard_tokens"]:  # a journal is written only when a shard is full
            raise _Forged(
                f"{name} is listed with {tokens} tokens, not a full shard's {settings['shard_tokens']}"
            )
        shard = out_dir / name
        if shard.is_symlink() or not shard.is_file() or sha256_file(shard) != entry["sha256"]:
            raise _Forged(f"{name} is missing or differs from the journal")
        try:
            array = np.load(shard, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise _Forged(f"{name} is not a token array ({e})") from None
        if array.ndim != 1 or array.shape[0] != tokens:
            raise _Forged(f"{name} holds {array.shape} tokens, not the {tokens} listed")
        eos = int(np.count_nonzero(array == settings["eos_id"]))
        checked.append({**entry, "eos": eos})
        if chat:
            _check_mask(out_dir, entry, index, tokens)
    return checked


def _check_mask(out_dir: Path, entry: dict[str, Any], index: int, tokens: int) -> None:
    name = mask_name(index)
    if entry["mask"] != name:
        raise _Forged(f"shard entry {index} names the mask {str(entry['mask'])[:40]!r}, not {name}")
    mask = out_dir / name
    if mask.is_symlink() or not mask.is_file() or sha256_file(mask) != entry["mask_sha256"]:
        raise _Forged(f"{name} is missing or differs from the journal")
    try:
        array = np.load(mask, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise _Forged(f"{name} is not a mask array ({e})") from None
    if array.ndim != 1 or array.shape[0] != tokens or array.dtype != np.uint8:
        raise _Forged(f"{name} is not {tokens} uint8 mask values")


def _cursor(value: Any, inputs: int) -> Cursor:
    if not isinstance(value, dict) or set(value) != {"input", "offset", "line"}:
        raise _Forged("its cursor is not an input, an offset and a line")
    cursor = Cursor(
        _int(value["input"], "the cursor's input"),
        _int(value["offset"], "the cursor's offset"),
        _int(value["line"], "the cursor's line", low=1),
    )
    if cursor.input >= inputs:
        raise _Forged(f"its cursor names input {cursor.input} of {inputs}")
    return cursor


def _counters(value: Any, chat: dict[str, Any] | None) -> Counters:
    keys = {"documents", "skipped", "examples", "block_fill"}
    if not isinstance(value, dict) or set(value) != keys:
        raise _Forged("its counters are not documents, skipped, examples and a block fill")
    fill = _int(value["block_fill"], "its block fill")
    if fill >= (chat["seq_len"] if chat else 1):
        raise _Forged(f"its block fill {fill} is not inside a block")
    skipped, examples = value["skipped"], value["examples"]
    if not isinstance(skipped, dict) or not all(isinstance(k, str) for k in skipped):
        raise _Forged("its skipped counts are not counts by class")
    if not isinstance(examples, list) or not all(isinstance(e, str) for e in examples):
        raise _Forged("its skipped examples are not messages")
    counts = {kind: _int(n, f"the count of {kind[:40]!r}") for kind, n in skipped.items()}
    return Counters(_int(value["documents"], "its document count"), counts, list(examples), fill)


def _tail(out_dir: Path, shards: list[dict[str, Any]], key: str, count: int) -> np.ndarray | None:
    """The last `count` values of the shards' `key` files (tokens or masks) as int64; None: fewer."""
    tail: list[np.ndarray] = []
    need = count
    for entry in reversed(shards):
        if need <= 0:
            break
        array = np.load(out_dir / entry[key], mmap_mode="r", allow_pickle=False)
        tail.insert(0, np.asarray(array[-need:], dtype=np.int64))
        need -= min(need, array.shape[0])
    return None if need > 0 else np.concatenate(tail)


def tail_problem(
    out_dir: Path, journal: Journal, first: tuple[np.ndarray, np.ndarray | None] | None
) -> str | None:
    """Why the journal's position is not where its shards end (None: it is). `first`: the tokens (and
    for chat data their mask) of the chunk at its cursor, encoded again (None: that chunk is a bad record
    or missing). Their first `skip_tokens` must be exactly the last tokens (and mask values) of the
    shards."""
    skip = journal.skip_tokens
    if first is None or first[0].size < skip:
        return f"the input at its cursor does not hold the {skip} tokens it says are in shards already"
    for key, values in (("file", first[0]), ("mask", first[1])):
        if values is None:
            continue
        tail = _tail(out_dir, journal.shards, key, skip)
        if tail is None or not np.array_equal(tail, values[:skip].astype(np.int64)):
            what = "tokens" if key == "file" else "loss mask"
            return f"its shards do not end with the {what} at its cursor: the position it names is not theirs"
    return None
