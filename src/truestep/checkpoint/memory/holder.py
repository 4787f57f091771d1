"""One rank's snapshot memory on its host (a tmpfs directory): the copies it holds -- its own, and those of
the peers it is a buddy of -- two slots per owner (double buffering), and the newest step it knows was
agreed by every rank.

A copy is `cOOOOO.S.bin` (the payload) and `cOOOOO.S.json` (its header: owner, step, size, SHA-256,
layout, the tensor table and the rank state). The header is written last and atomically: a copy whose
header is missing is being written (or was torn), never used; a header is removed before its slot is
written again. Headers are read bounded and checked field by field: the directory is input, not trust.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from truestep.core.fsio import OversizeFileError, UnsafePathError, atomic_write, make_dir, read_regular

SLOTS = (0, 1)
HEADER_LIMIT = 256 << 20
"""A header holds the tensor table and the rank state: far below this even at thousands of tensors."""
FORMAT = "truestep-snapshot"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
AGREED = "agreed.json"


class SnapshotFormatError(Exception):
    """A copy's header is not a well-formed snapshot header."""


@dataclass(frozen=True)
class CopyHeader:
    owner: int
    """The rank whose state this is."""
    step: int
    nbytes: int
    sha256: str
    """Of the payload, computed by the owner while writing it."""
    param_digest: str
    """The owner's model digest of the state captured (payload.model_digest: every model key and its
    bytes), for the restore's end-to-end check of the live model."""
    identity: dict[str, Any]
    """run_id, config fingerprint and layout: a copy of another run, config or layout is never used."""
    table: list[dict[str, Any]]
    """One entry per tensor: part (model|optim), key, dtype, shape, offset, nbytes."""
    rank_state: dict[str, Any]
    """train_state, data_position, rng (checkpoint.state.RankState fields)."""

    def to_json(self) -> bytes:
        blob = {"format": FORMAT, "version": 1, **self.__dict__}
        return json.dumps(blob, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> CopyHeader:
        try:
            blob = json.loads(data)
        except (ValueError, RecursionError) as err:
            raise SnapshotFormatError(f"not JSON: {type(err).__name__}") from err
        if not isinstance(blob, dict) or blob.get("format") != FORMAT or blob.get("version") != 1:
            raise SnapshotFormatError("not a truestep snapshot header (v1)")
        ints = {k: blob.get(k) for k in ("owner", "step", "nbytes")}
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in ints.values()):
            raise SnapshotFormatError(f"malformed owner/step/nbytes {ints!r:.80}")
        for key in ("sha256", "param_digest"):
            if not isinstance(blob.get(key), str) or not _HEX64.match(blob[key]):
                raise SnapshotFormatError(f"malformed {key}")
        if not isinstance(blob.get("identity"), dict) or not isinstance(blob.get("rank_state"), dict):
            raise SnapshotFormatError("malformed identity or rank_state")
        table = blob.get("table")
        if not isinstance(table, list) or not all(_entry_ok(e, ints["nbytes"]) for e in table):
            raise SnapshotFormatError("malformed tensor table")
        return cls(
            owner=ints["owner"],
            step=ints["step"],
            nbytes=ints["nbytes"],
            sha256=blob["sha256"],
            param_digest=blob["param_digest"],
            identity=blob["identity"],
            table=table,
            rank_state=blob["rank_state"],
        )


def _entry_ok(entry: Any, total: int) -> bool:
    if not isinstance(entry, dict) or entry.get("part") not in ("model", "optim"):
        return False
    offset, nbytes, shape = entry.get("offset"), entry.get("nbytes"), entry.get("shape")
    numbers = [offset, nbytes, *(shape if isinstance(shape, list) else [None])]
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in numbers):
        return False
    return (
        isinstance(entry.get("key"), str) and isinstance(entry.get("dtype"), str) and offset + nbytes <= total
    )


class Holder:
    """The copies one rank holds on its host."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def ensure(self) -> None:
        make_dir(self.dir)
        os.chmod(self.dir, 0o700)  # this rank's memory: nobody else's to read or truncate

    def payload(self, owner: int, slot: int) -> Path:
        return self.dir / f"c{owner:05d}.{slot}.bin"

    def header_path(self, owner: int, slot: int) -> Path:
        return self.dir / f"c{owner:05d}.{slot}.json"

    def header(self, owner: int, slot: int) -> CopyHeader | None:
        """The slot's header when the copy is complete and well formed (its payload has the size it
        declares), else None."""
        try:
            header = CopyHeader.parse(read_regular(self.header_path(owner, slot), HEADER_LIMIT))
            size = os.lstat(self.payload(owner, slot)).st_size
        except (FileNotFoundError, SnapshotFormatError, UnsafePathError, OversizeFileError, OSError):
            return None
        if header.owner != owner or size != header.nbytes:
            return None
        return header

    def copies(self, owner: int) -> dict[int, tuple[int, CopyHeader]]:
        """step -> (slot, header) of the complete copies of `owner`'s state held here."""
        found: dict[int, tuple[int, CopyHeader]] = {}
        for slot in SLOTS:
            header = self.header(owner, slot)
            if header is not None:
                found[header.step] = (slot, header)
        return found

    def owners(self) -> list[int]:
        """Every owner with a header file here (complete or not)."""
        found = set()
        if self.dir.is_dir():
            for entry in self.dir.iterdir():
                match = re.match(r"^c(\d{5})\.[01]\.json$", entry.name)
                if match:
                    found.add(int(match.group(1)))
        return sorted(found)

    def slot_for(self, owner: int, keep_step: int | None) -> int:
        """The slot to write `owner`'s next copy into: never the one holding `keep_step` (the last agreed)."""
        held = self.copies(owner)
        keep = held.get(keep_step, (None, None))[0] if keep_step is not None else None
        for slot in SLOTS:
            if slot != keep and self.header(owner, slot) is None:
                return slot
        return next(slot for slot in SLOTS if slot != keep)

    def begin(self, owner: int, slot: int) -> Path:
        """The slot is about to be written: it stops being a complete copy first."""
        self.header_path(owner, slot).unlink(missing_ok=True)
        return self.payload(owner, slot)

    def commit(self, slot: int, header: CopyHeader) -> None:
        atomic_write(self.header_path(header.owner, slot), header.to_json(), durable=False)

    def agreed(self) -> int | None:
        try:
            blob = json.loads(read_regular(self.dir / AGREED, 4096))
        except (FileNotFoundError, ValueError, UnsafePathError, OversizeFileError, OSError):
            return None
        step = blob.get("step") if isinstance(blob, dict) else None
        return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None

    def set_agreed(self, step: int) -> None:
        atomic_write(self.dir / AGREED, json.dumps({"step": step}).encode(), durable=False)

    def forget_except(self, keep_step: int | None) -> None:
        """Drop every copy (and the agreed mark) but those of `keep_step`: a restore starts a new timeline,
        and a copy of a step it did not restore belongs to another one."""
        for owner in self.owners():
            for slot in SLOTS:
                header = self.header(owner, slot)
                if keep_step is None or header is None or header.step != keep_step:
                    self.header_path(owner, slot).unlink(missing_ok=True)
                    self.payload(owner, slot).unlink(missing_ok=True)
        if keep_step is None:
            (self.dir / AGREED).unlink(missing_ok=True)
        else:
            self.set_agreed(keep_step)


def forget_holder(directory: Path) -> bool:
    """A rank's memory is lost (its process failed): remove everything it held. True if anything was."""
    if not directory.is_dir() or directory.is_symlink():
        return False
    shutil.rmtree(directory)
    return True
