"""TensorBoard event files read without TensorBoard or protobuf: TFRecord framing, and of the `Event`
message only what a scalar needs (wall_time, step, summary values: tag with simple_value or a
one-element float/double tensor).

Written for files that may be torn (a killed writer) or hostile: every length is checked against what
is left, a record longer than MAX_RECORD ends the file, and a record that does not parse is skipped and
counted, never raised. The CRCs are not checked (crc32c is not in the standard library); a record that
does not parse as an Event is what a corruption leaves, and it is counted in `bad`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass

MAX_RECORD = 16 << 20
"""A scalar event is a few hundred bytes; a larger record is a summary of something else or garbage."""
DT_FLOAT, DT_DOUBLE = 1, 2


class _Malformed(ValueError):
    pass


@dataclass(frozen=True)
class Scalar:
    wall_time: float
    step: int
    tag: str
    value: float


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Malformed("varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of one protobuf message: an int for varint and fixed-width
    fields (fixed ones as their raw little-endian integer), bytes for length-delimited ones."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > len(data):
                raise _Malformed("fixed field")
            yield number, wire, int.from_bytes(data[pos : pos + width], "little")
            pos += width
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise _Malformed("length")
            yield number, wire, data[pos : pos + length]
            pos += length
        else:
            raise _Malformed(f"wire type {wire}")


def _float(bits: int, wire: int) -> float:
    return struct.unpack("<d", bits.to_bytes(8, "little"))[0] if wire == 1 else _f32(bits)


def _f32(bits: int) -> float:
    return struct.unpack("<f", bits.to_bytes(4, "little"))[0]


def _tensor_value(data: bytes) -> float | None:
    """A one-element DT_FLOAT or DT_DOUBLE TensorProto's value (new-style scalar summaries)."""
    dtype, values = None, []
    for number, wire, value in fields(data):
        if number == 1 and wire == 0:
            dtype = value
        elif number == 4 and isinstance(value, bytes):  # tensor_content: raw little-endian values
            values.append(value)
        elif number in (5, 6) and wire in (1, 5):
            values.append(_float(int(value), wire))  # type: ignore[arg-type]
        elif number in (5, 6) and isinstance(value, bytes):  # packed repeated float/double
            size = 4 if number == 5 else 8
            values += [
                _float(int.from_bytes(value[i : i + size], "little"), 5 if size == 4 else 1)
                for i in range(0, len(value) - size + 1, size)
            ]
    if dtype not in (DT_FLOAT, DT_DOUBLE) or len(values) != 1:
        return None
    (value,) = values
    if isinstance(value, bytes):
        size = 4 if dtype == DT_FLOAT else 8
        if len(value) != size:
            return None
        return struct.unpack("<f" if size == 4 else "<d", value)[0]
    return value


def _summary_values(data: bytes) -> Iterator[tuple[str, float]]:
    for number, _, value in fields(data):
        if number != 1 or not isinstance(value, bytes):
            continue
        tag, scalar = None, None
        for n, wire, v in fields(value):
            if n == 1 and isinstance(v, bytes):
                tag = v.decode("utf-8", "replace")
            elif n == 2 and wire == 5:
                scalar = _f32(int(v))  # type: ignore[arg-type]
            elif n == 8 and isinstance(v, bytes):
                scalar = _tensor_value(v)
        if tag is not None and scalar is not None:
            yield tag, scalar


def event_scalars(record: bytes) -> list[Scalar]:
    """The scalars of one Event record (none for file-version, graph or other events)."""
    wall_time, step, found = 0.0, 0, []
    for number, wire, value in fields(record):
        if number == 1 and wire == 1:
            wall_time = _float(int(value), 1)  # type: ignore[arg-type]
        elif number == 2 and wire == 0:
            step = int(value)  # type: ignore[arg-type]
            step = step - (1 << 64) if step >= 1 << 63 else step
        elif number == 5 and isinstance(value, bytes):
            found += list(_summary_values(value))
    if not math.isfinite(wall_time):
        raise _Malformed("wall_time")
    return [Scalar(wall_time, step, tag, v) for tag, v in found]


def read_scalars(data: bytes) -> tuple[list[Scalar], int, bool]:
    """Every scalar of an event file's bytes, in file order; the number of records that did not parse;
    and whether the file ends in a torn record (a writer killed mid-record, or one still writing)."""
    pos, out, bad = 0, [], 0
    while pos < len(data):
        if pos + 12 > len(data):
            return out, bad, True
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        if length > MAX_RECORD:
            return out, bad + 1, False
        end = pos + 12 + length + 4
        if end > len(data):
            return out, bad, True
        try:
            out += event_scalars(data[pos + 12 : pos + 12 + length])
        except _Malformed:
            bad += 1
        pos = end
    return out, bad, False
