"""Stream the inputs as chunks of about `CHUNK_BYTES` of text, each knowing where it starts.

The main process reads (files, decompression, Parquet/Arrow decoding: all C code); the workers parse
and tokenize (data/encode.py). A chunk carries its file, its first line (1-based) or row (0-based) and a
`Cursor` from which reading can start again (a resumed prepare-data). Chunk boundaries never change the
tokens: documents are tokenized one by one, so any cut gives the same stream. A problem found while
reading (a truncated compressed file, a Parquet file without the column) travels as a PROBLEM chunk, so
it is reported in stream order like a bad line a worker finds.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from truestep.data.inputs import HF_DATASET, JSONL, JSONL_GZ, JSONL_ZST, PARQUET, TEXT, InputError, InputFile

CHUNK_BYTES = 1 << 20
"""Text per chunk: large enough that handing it to a worker costs little, small enough to keep many in
flight in bounded memory."""
ARROW_BATCH_ROWS = 8192
COMPRESSED_READ = 1 << 16
"""Compressed bytes decompressed at a time (bounds what one feed can expand to)."""
LINES, DOCS, ARROW, PROBLEM = "lines", "docs", "arrow", "problem"
TEXT_TYPES = ("string", "large_string", "string_view", "binary", "large_binary", "binary_view")


@dataclass(frozen=True)
class Cursor:
    """Where reading starts: an input, and in it a byte offset of the (decompressed) stream with its line
    number (JSONL), or a row (Parquet, datasets)."""

    input: int = 0
    offset: int = 0
    line: int = 1


@dataclass
class Chunk:
    cursor: Cursor
    where: str
    kind: str
    payload: Any
    """LINES: bytes of whole lines; DOCS: [bytes] (one document per text file); ARROW: a text column slice."""
    first: int
    """First line (1-based, LINES) or row (0-based, ARROW) of the chunk."""
    done_bytes: int
    """Input bytes on disk read once this chunk is done, over all inputs (the progress bar's unit)."""
    problem: tuple[str, str] | None = None
    """(bad-input class, one-line message) for a PROBLEM chunk."""


def read_chunks(inputs: list[InputFile], text_field: str, start: Cursor | None = None) -> Iterator[Chunk]:
    """Every chunk of `inputs` from `start` on, in stream order."""
    start = start or Cursor()
    base = sum(item.size for item in inputs[: start.input])
    for index in range(start.input, len(inputs)):
        item = inputs[index]
        cursor = start if index == start.input else Cursor(index)
        if item.kind == TEXT:
            yield _text(item, cursor, base)
        elif item.kind in (JSONL, JSONL_GZ, JSONL_ZST):
            yield from _jsonl(item, cursor, base)
        elif item.kind == PARQUET:
            yield from _parquet(item, cursor, base, text_field)
        elif item.kind == HF_DATASET:
            yield from _dataset(item, cursor, base, text_field)
        else:  # pragma: no cover - inputs.py decides the kinds
            raise AssertionError(item.kind)
        base += item.size


def _problem(item: InputFile, cursor: Cursor, base: int, kind: str, message: str) -> Chunk:
    return Chunk(cursor, str(item.path), PROBLEM, None, cursor.line, base + item.size, (kind, message))


def _text(item: InputFile, cursor: Cursor, base: int) -> Chunk:
    try:
        data = item.path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read input file {item.path}: {e}") from e
    return Chunk(cursor, str(item.path), DOCS, [data], 0, base + item.size)


class _Decompressed:
    """read(n) over a compressed file of members/frames back to back (gzip via zlib, or zstd). The bytes
    decompressed before a truncation are returned first; the next read raises EOFError."""

    def __init__(self, raw: IO[bytes], kind: str) -> None:
        if kind == JSONL_GZ:
            self._new: Any = lambda: zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            self._errors: tuple[type[Exception], ...] = (zlib.error,)
        else:
            try:
                import zstandard
            except ImportError as e:
                raise InputError(
                    "reading .zst needs the `zstandard` package: pip install 'truestep[corpora]'"
                ) from e
            self._new = zstandard.ZstdDecompressor().decompressobj
            self._errors = (zstandard.ZstdError,)
        self.kind = kind
        self.raw, self.dobj, self.buf = raw, self._new(), bytearray()
        self.ended, self.problem = False, ""

    def read(self, n: int) -> bytes:
        if self.problem and not self.buf:
            raise EOFError(self.problem)
        while len(self.buf) < n and not self.ended:
            compressed = self.raw.read(COMPRESSED_READ)
            if not compressed:
                self.ended = True
                if not self.dobj.eof:
                    self.problem = f"the {self.kind.rsplit('.', 1)[1]} stream ends inside a member"
                break
            try:
                self.buf += self.dobj.decompress(compressed)
                while self.dobj.eof and self.dobj.unused_data:
                    rest, self.dobj = self.dobj.unused_data, self._new()
                    self.buf += self.dobj.decompress(rest)
            except self._errors as e:
                self.ended, self.problem = True, f"corrupt data: {e}"
        out = bytes(self.buf[:n])
        del self.buf[:n]
        if not out and self.problem:
            raise EOFError(self.problem)
        return out


def _jsonl(item: InputFile, cursor: Cursor, base: int) -> Iterator[Chunk]:
    where = str(item.path)
    if item.kind != JSONL and item.size == 0:
        yield _problem(item, cursor, base, "empty_compressed", f"{where}: empty compressed file (0 bytes)")
        return
    with open(item.path, "rb") as raw:
        stream: Any = raw if item.kind == JSONL else _Decompressed(raw, item.kind)
        pos, line, carry = cursor.offset, cursor.line, b""
        try:
            if item.kind == JSONL:
                raw.seek(pos)
            else:  # a compressed stream resumes by decompressing up to its offset
                for _ in range(pos // CHUNK_BYTES):
                    stream.read(CHUNK_BYTES)
                stream.read(pos % CHUNK_BYTES)
            while block := stream.read(CHUNK_BYTES):
                data = carry + block
                cut = data.rfind(b"\n") + 1
                if not cut:  # one line longer than a chunk: keep reading until it ends
                    carry = data
                    continue
                lines, carry = data[:cut], data[cut:]
                yield Chunk(Cursor(cursor.input, pos, line), where, LINES, lines, line, base + raw.tell())
                pos += cut
                line += lines.count(b"\n")
        except EOFError as e:
            yield _problem(
                item,
                Cursor(cursor.input, pos, line),
                base,
                "truncated",
                f"{where}: the compressed file is truncated or corrupt after line {line - 1} ({e})",
            )
            return
        if carry:  # a last line without its newline
            yield Chunk(Cursor(cursor.input, pos, line), where, LINES, carry, line, base + item.size)


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet  # noqa: F401  (pyarrow.compute and pyarrow.parquet are submodules)
    except ImportError as e:
        raise InputError(
            "reading Parquet or datasets needs `pyarrow`: pip install 'truestep[corpora]'"
        ) from e
    return pyarrow


def _column_problem(schema: Any, field: str) -> str | None:
    if field not in schema.names:
        return f"no column {field!r} (columns: {', '.join(schema.names)}); name the text column with --text-field"
    kind = str(schema.field(field).type)
    return None if kind in TEXT_TYPES else f"column {field!r} holds {kind}, not text"


def _slices(pa: Any, column: Any, first_row: int) -> Iterator[tuple[Any, int]]:
    """`column` cut into compact pieces of about CHUNK_BYTES of text (each with its first row)."""
    lengths = pa.compute.fill_null(pa.compute.binary_length(column), 0).to_numpy(zero_copy_only=False)
    ends = np.cumsum(lengths, dtype=np.int64)
    start = 0
    while start < len(column):
        before = int(ends[start - 1]) if start else 0
        stop = min(len(column), max(start + 1, int(np.searchsorted(ends, before + CHUNK_BYTES, "right"))))
        # concat_arrays copies the slice out: a pickled slice would carry its whole parent buffer.
        yield pa.concat_arrays([column.slice(start, stop - start)]), first_row + start
        start = stop


def _parquet(item: InputFile, cursor: Cursor, base: int, field: str) -> Iterator[Chunk]:
    pa = _pyarrow()
    where = str(item.path)
    try:
        pf = pa.parquet.ParquetFile(item.path)
        problem = _column_problem(pf.schema_arrow, field)
    except (pa.ArrowException, OSError) as e:
        yield _problem(item, cursor, base, "unreadable", f"{where}: not a readable Parquet file: {e}")
        return
    if problem:
        yield _problem(item, cursor, base, "missing_column", f"{where}: {problem}")
        return
    total = max(1, pf.metadata.num_rows)
    row = 0
    for group in range(pf.num_row_groups):
        rows = pf.metadata.row_group(group).num_rows
        if row + rows <= cursor.offset:
            row += rows
            continue
        try:
            for batch in pf.iter_batches(ARROW_BATCH_ROWS, row_groups=[group], columns=[field]):
                column = batch.column(0)
                skip = min(len(column), max(0, cursor.offset - row))
                for piece, first in _slices(pa, column.slice(skip), row + skip):
                    done = base + item.size * (first + len(piece)) // total
                    yield Chunk(Cursor(cursor.input, first), where, ARROW, piece, first, done)
                row += len(column)
        except (pa.ArrowException, OSError) as e:
            yield _problem(
                item, Cursor(cursor.input, row), base, "unreadable", f"{where}: row {row}: unreadable: {e}"
            )
            return


def _dataset(item: InputFile, cursor: Cursor, base: int, field: str) -> Iterator[Chunk]:
    pa = _pyarrow()
    where = str(item.path)  # rows are numbered over the whole dataset, as `dataset[row]` indexes them
    row, done = 0, base
    for part in item.parts:
        try:
            with pa.memory_map(str(part)) as source:
                reader = pa.ipc.open_stream(source)
                problem = _column_problem(reader.schema, field)
                if problem:
                    yield _problem(item, cursor, base, "missing_column", f"{part}: {problem}")
                    return
                index = reader.schema.get_field_index(field)
                size = part.stat().st_size
                for batch in reader:
                    column = batch.column(index)
                    skip = min(len(column), max(0, cursor.offset - row))
                    for piece, first in _slices(pa, column.slice(skip), row + skip):
                        yield Chunk(Cursor(cursor.input, first), where, ARROW, piece, first, done)
                    row += len(column)
                done += size
        except (pa.ArrowException, OSError) as e:
            yield _problem(item, Cursor(cursor.input, row), base, "unreadable", f"{part}: unreadable: {e}")
            return
