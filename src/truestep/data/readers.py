"""Stream the inputs as chunks of about `CHUNK_BYTES` of text, each knowing where it starts.

The main process reads (files, decompression, Parquet/Arrow decoding: all C code); the workers parse
and tokenize (data/encode.py). A chunk carries its file, its first line (1-based) or row (0-based) and a
`Cursor` from which reading can start again (a resumed prepare-data). Chunk boundaries never change the
tokens: documents are tokenized one by one, so any cut gives the same stream. A problem found while
reading (a truncated compressed file, a Parquet file without the column) travels as a PROBLEM chunk, so
it is reported in stream order like a bad line a worker finds.

Inputs are someone else's bytes, so reading is bounded whatever they hold: a record (a JSON line, a text
file's one document, an Arrow row) is at most MAX_RECORD_BYTES (`too_long`: a line is read past, not
held); a compressed file is decompressed a bounded piece at a time (never a whole frame's output at
once) and may expand at most MAX_RATIO times its compressed size beyond RATIO_FLOOR
(`decompression_bound`: a 64 KiB zstd frame of 2 GiB is a bomb, not a corpus); every Arrow record batch
is validated in full before a value of it is touched (offsets and lengths inside their buffers, UTF-8),
so a crafted file is `unreadable` in one line, never a native abort or bytes from beyond a buffer.
Files are opened at the real path the inputs resolved to (data/inputs.py), without following links.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from truestep.core.fsio import UnsafePathError, open_regular
from truestep.data.inputs import HF_DATASET, JSONL, JSONL_GZ, JSONL_ZST, PARQUET, TEXT, InputError, InputFile

CHUNK_BYTES = 1 << 20
"""Text per chunk: large enough that handing it to a worker costs little, small enough to keep many in
flight in bounded memory."""
ARROW_BATCH_ROWS = 8192
COMPRESSED_READ = 1 << 16
"""Compressed bytes read from the file at a time."""
GZIP_OUT = 4 << 20
"""The most bytes one gzip feed may expand to (zlib's max_length; the rest waits for the next read)."""
ZSTD_PIECE = 1 << 10
"""Compressed bytes handed to zstd at a time: its streaming object has no output bound, and one byte of a
frame expands to at most ~32 KiB (an RLE block), so a piece expands to at most ~32 MiB."""
MAX_RECORD_BYTES = 64 << 20
"""The largest record prepare-data takes: a JSON line, a text file (one document), an Arrow value. A
larger one is `too_long` (split it into documents)."""
MAX_RATIO = 1000
"""A compressed input may expand to at most this many times the compressed bytes read so far (gzip
cannot exceed ~1030; text corpora compress 3-20x) ..."""
RATIO_FLOOR = 64 << 20
"""... once past this many decompressed bytes (a tiny file of a blank page is no bomb)."""
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


def _problem(
    item: InputFile, cursor: Cursor, base: int, kind: str, message: str, first: int | None = None
) -> Chunk:
    first = cursor.line if first is None else first
    return Chunk(cursor, str(item.path), PROBLEM, None, first, base + item.size, (kind, message))


def _open(item: InputFile) -> IO[bytes]:
    """The input's file, opened at its real path without following a link (never a FIFO or device)."""
    try:
        return os.fdopen(open_regular(item.source), "rb")
    except UnsafePathError as e:
        raise InputError(f"input {item.path}: {e.strerror}") from None
    except OSError as e:
        raise InputError(f"cannot read input file {item.path}: {e.strerror or e}") from None


def _text(item: InputFile, cursor: Cursor, base: int) -> Chunk:
    with _open(item) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        return _problem(
            item, cursor, base, "too_long", f"{item.path}: a text file is one document of at most "
            f"{MAX_RECORD_BYTES} bytes (this one has {size}); split it, e.g. into JSONL lines",
        )  # fmt: skip
    return Chunk(cursor, str(item.path), DOCS, [data], 0, base + item.size)


class _Decompressed:
    """read(n) over a compressed file of members/frames back to back (gzip via zlib, or zstd), bounded:
    each feed expands to at most GZIP_OUT (gzip) or ZSTD_PIECE's worth (zstd), and the whole to at most
    MAX_RATIO times the compressed bytes past RATIO_FLOOR. The bytes decompressed before a truncation (or
    the bound) are returned first; the next read raises EOFError with `kind` set."""

    def __init__(self, raw: IO[bytes], kind: str) -> None:
        self.gzip = kind == JSONL_GZ
        if self.gzip:
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
        self.format = kind.rsplit(".", 1)[1]
        self.raw, self.dobj, self.buf, self.pending = raw, self._new(), bytearray(), b""
        self.read_in = self.out = 0
        self.ended, self.problem, self.kind = False, "", "truncated"

    def read(self, n: int) -> bytes:
        if self.problem and not self.buf:
            raise EOFError(self.problem)
        while len(self.buf) < n and not self.ended:
            if not self.pending:
                self.pending = self.raw.read(COMPRESSED_READ)
                self.read_in += len(self.pending)
                if not self.pending:
                    self.ended = True
                    if not self.dobj.eof:
                        self.problem = f"the {self.format} stream ends inside a member"
                    break
            try:
                self._feed()
            except self._errors as e:
                self.ended, self.problem = True, f"corrupt data: {e}"
            if self.out > max(RATIO_FLOOR, MAX_RATIO * self.read_in):
                self.ended, self.kind = True, "decompression_bound"
                self.problem = (
                    f"it expands to more than {MAX_RATIO} times its compressed size ({self.out} bytes from "
                    f"{self.read_in}): a decompression bomb, not a corpus"
                )
        out = bytes(self.buf[:n])
        del self.buf[:n]
        if not out and self.problem:
            raise EOFError(self.problem)
        return out

    def _feed(self) -> None:
        """Decompress the next bounded piece of `pending`; a member/frame that ends starts the next."""
        if self.gzip:
            data, self.pending = self.pending, b""
            produced = self.dobj.decompress(data, GZIP_OUT)
            self.pending = self.dobj.unconsumed_tail
        else:
            data, self.pending = self.pending[:ZSTD_PIECE], self.pending[ZSTD_PIECE:]
            produced = self.dobj.decompress(data)
        self.buf += produced
        self.out += len(produced)
        if self.dobj.eof and (self.dobj.unused_data or self.pending):
            self.pending = self.dobj.unused_data + self.pending
            self.dobj = self._new()


def _jsonl(item: InputFile, cursor: Cursor, base: int) -> Iterator[Chunk]:
    where = str(item.path)
    if item.kind != JSONL and item.size == 0:
        yield _problem(item, cursor, base, "empty_compressed", f"{where}: empty compressed file (0 bytes)")
        return
    with _open(item) as raw:
        stream: Any = raw if item.kind == JSONL else _Decompressed(raw, item.kind)
        pos, line = cursor.offset, cursor.line
        carry = bytearray()  # the start of a line not yet ended (at most MAX_RECORD_BYTES)
        skipping = False  # inside a line over MAX_RECORD_BYTES: read past it, never held
        try:
            if item.kind == JSONL:
                raw.seek(pos)
            else:  # a compressed stream resumes by decompressing up to its offset
                for _ in range(pos // CHUNK_BYTES):
                    stream.read(CHUNK_BYTES)
                stream.read(pos % CHUNK_BYTES)
            while block := stream.read(CHUNK_BYTES):
                if skipping:
                    end = block.find(b"\n")
                    if end < 0:
                        pos += len(block)
                        continue
                    pos, line, skipping, block = pos + end + 1, line + 1, False, block[end + 1 :]
                searched = len(carry)
                carry += block
                first_end = carry.find(b"\n", searched)
                if searched and first_end > MAX_RECORD_BYTES:  # the line held so far ends here, too long
                    yield _problem(
                        item, Cursor(cursor.input, pos, line), base, "too_long",
                        f"{where}:{line}: a line longer than {MAX_RECORD_BYTES} bytes", first=line,
                    )  # fmt: skip
                    pos, line = pos + first_end + 1, line + 1
                    del carry[: first_end + 1]
                    searched = 0
                cut = carry.rfind(b"\n", searched) + 1
                if not cut:  # one line longer than a chunk: keep reading until it ends, within bounds
                    if len(carry) > MAX_RECORD_BYTES:
                        yield _problem(
                            item, Cursor(cursor.input, pos, line), base, "too_long",
                            f"{where}:{line}: a line longer than {MAX_RECORD_BYTES} bytes", first=line,
                        )  # fmt: skip
                        pos, skipping = pos + len(carry), True
                        carry.clear()
                    continue
                lines = bytes(carry[:cut])
                del carry[:cut]
                yield Chunk(Cursor(cursor.input, pos, line), where, LINES, lines, line, base + raw.tell())
                pos += cut
                line += lines.count(b"\n")
        except EOFError as e:
            kind = stream.kind if isinstance(stream, _Decompressed) else "truncated"
            what = "is cut off by its bound" if kind == "decompression_bound" else "is truncated or corrupt"
            yield _problem(
                item,
                Cursor(cursor.input, pos, line),
                base,
                kind,
                f"{where}: the compressed file {what} after line {line - 1} ({e})",
            )
            return
        if carry and not skipping:  # a last line without its newline
            yield Chunk(Cursor(cursor.input, pos, line), where, LINES, bytes(carry), line, base + item.size)


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


def _validated(batch: Any) -> Any:
    """`batch` once its every buffer, offset and length is checked to hold (ArrowInvalid otherwise): a
    crafted file's offsets past a buffer's end are refused here, before anything reads through them."""
    batch.validate(full=True)
    return batch


def _slices(pa: Any, column: Any, first_row: int) -> Iterator[tuple[Any | None, int]]:
    """`column` cut into compact pieces of about CHUNK_BYTES of text (each with its first row); a value
    over MAX_RECORD_BYTES comes alone, as (None, its row)."""
    lengths = pa.compute.fill_null(pa.compute.binary_length(column), 0).to_numpy(zero_copy_only=False)
    ends = np.cumsum(lengths, dtype=np.int64)
    huge = set(np.flatnonzero(lengths > MAX_RECORD_BYTES).tolist())
    start = 0
    while start < len(column):
        if start in huge:
            yield None, first_row + start
            start += 1
            continue
        before = int(ends[start - 1]) if start else 0
        stop = min(len(column), max(start + 1, int(np.searchsorted(ends, before + CHUNK_BYTES, "right"))))
        stop = min([stop, *(h for h in huge if h > start)])
        # concat_arrays copies the slice out: a pickled slice would carry its whole parent buffer.
        yield pa.concat_arrays([column.slice(start, stop - start)]), first_row + start
        start = stop


def _too_long(item: InputFile, cursor: Cursor, base: int, where: str, row: int) -> Chunk:
    message = f"{where}: row {row}: a value longer than {MAX_RECORD_BYTES} bytes"
    return _problem(item, Cursor(cursor.input, row), base, "too_long", message, first=row)


def _parquet(item: InputFile, cursor: Cursor, base: int, field: str) -> Iterator[Chunk]:
    with _open(item) as handle:
        yield from _parquet_rows(item, cursor, base, field, handle)


def _parquet_rows(
    item: InputFile, cursor: Cursor, base: int, field: str, handle: IO[bytes]
) -> Iterator[Chunk]:
    pa = _pyarrow()
    where = str(item.path)
    try:
        pf = pa.parquet.ParquetFile(handle)
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
                column = _validated(batch).column(0)
                skip = min(len(column), max(0, cursor.offset - row))
                for piece, first in _slices(pa, column.slice(skip), row + skip):
                    if piece is None:
                        yield _too_long(item, cursor, base, where, first)
                        continue
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
                    column = _validated(batch).column(index)
                    skip = min(len(column), max(0, cursor.offset - row))
                    for piece, first in _slices(pa, column.slice(skip), row + skip):
                        if piece is None:
                            yield _too_long(item, cursor, base, where, first)
                            continue
                        yield Chunk(Cursor(cursor.input, first), where, ARROW, piece, first, done)
                    row += len(column)
                done += size
        except (pa.ArrowException, OSError) as e:
            yield _problem(item, Cursor(cursor.input, row), base, "unreadable", f"{part}: unreadable: {e}")
            return
