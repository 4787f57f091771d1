"""The worker side of `prepare-data`: a chunk (data/readers.py) in, its documents' tokens out.

Each document becomes [BOS] ids EOS; with a chat spec each record is a conversation, rendered with the
chat template into tokens and a loss mask (data/chat.py), returned with each conversation's length for
the packer in the main process. A bad record (a line that is not JSON, a missing or non-string text
field, invalid UTF-8, a null Parquet value) is reported with its file and line/row; with `skip_bad` it is
skipped and counted by class instead. Runs in worker processes, or in the main process with one worker:
the tokens are the same either way.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from truestep.data.chat import BadConversation, ChatSpec, conversation, encode_conversation, segments
from truestep.data.chat_template import ChatTemplate, TemplateFailed, TemplateRefused
from truestep.data.errors import DataError
from truestep.data.native import native_calls
from truestep.data.readers import ARROW, DOCS, LINES, PROBLEM, Chunk
from truestep.data.tokenizer_guard import check_tokenizer_definition

BAD_CLASSES = (
    "malformed_json",
    "missing_field",
    "not_a_string",
    "invalid_utf8",
    "empty_compressed",
    "truncated",
    "missing_column",
    "unreadable",
    "too_long",
    "decompression_bound",
    "bad_conversation",
    "chat_template",
    "conversation_too_long",
)
"""The bad-input classes `--skip-bad` counts in meta.json (`skipped`)."""
EXAMPLES_KEPT = 20


@dataclass(frozen=True)
class EncoderSpec:
    """Everything a worker needs; plain data, so it pickles to a spawned process."""

    tokenizer_json: str | None
    """The tokenizer.json text; None for the byte tokenizer."""
    vocab_size: int
    eos_id: int
    bos_id: int | None
    """Prepended to every document when set (--bos)."""
    text_field: str
    skip_bad: bool
    dtype: str
    chat: ChatSpec | None = None
    """Set: records are conversations (data/chat.py), not text."""


@dataclass
class ChunkResult:
    tokens: np.ndarray
    documents: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    """The first skipped records' messages."""
    error: str | None = None
    """Without skip_bad: the first bad record's one-line message (nothing else is returned then)."""
    mask: np.ndarray | None = None
    """Chat: 1 where `tokens` are trained (uint8)."""
    lengths: list[int] | None = None
    """Chat: the tokens of each conversation, in order."""


class _Bad(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class Encoder:
    def __init__(self, spec: EncoderSpec) -> None:
        self.spec = spec
        self.dtype = np.dtype(spec.dtype)
        self.tok: Any = None
        if spec.tokenizer_json is not None:
            import tokenizers

            check_tokenizer_definition(spec.tokenizer_json, "tokenizer.json")  # checked where it is loaded
            self.tok = tokenizers.Tokenizer.from_str(spec.tokenizer_json)
        self.template = None
        if spec.chat is not None:
            self.template = ChatTemplate(spec.chat.template, spec.chat.special_tokens, spec.chat.where)

    def encode(self, chunk: Chunk) -> ChunkResult:
        if self.spec.chat is not None:
            return self._encode_chat(chunk, self.spec.chat)
        result = ChunkResult(np.empty(0, dtype=self.dtype))
        texts: list[str] = []
        for item in self._records(chunk):
            if isinstance(item, _Bad):
                if not self.spec.skip_bad:
                    return ChunkResult(result.tokens, error=item.message)
                result.skipped[item.kind] = result.skipped.get(item.kind, 0) + 1
                if len(result.examples) < EXAMPLES_KEPT:
                    result.examples.append(item.message)
            else:
                texts.append(item)
        try:  # a panic cannot be pickled back from a worker: it is returned as this chunk's error
            with native_calls(f"{chunk.where}: tokenizing"):
                result.tokens = self._tokens(texts)
        except DataError as err:
            return ChunkResult(result.tokens, error=str(err))
        result.documents = len(texts)
        return result

    # -- records ------------------------------------------------------------------------------------

    def _records(self, chunk: Chunk) -> list[str | _Bad]:
        if chunk.kind == PROBLEM:
            assert chunk.problem is not None
            return [_Bad(*chunk.problem)]
        if chunk.kind == DOCS:
            return [_decode(data, chunk.where) for data in chunk.payload]
        if chunk.kind == LINES:
            return self._lines(chunk)
        if chunk.kind == ARROW:
            return self._rows(chunk)
        raise AssertionError(chunk.kind)

    def _objects(self, chunk: Chunk) -> list[tuple[str, str, dict[str, Any] | _Bad]]:
        """(where, the line, its JSON object or why not) for every record of a LINES chunk."""
        out: list[tuple[str, str, dict[str, Any] | _Bad]] = []
        for k, raw in enumerate(chunk.payload.split(b"\n")):
            if not raw.strip():
                continue  # blank lines (and the end of the chunk) are not records
            where = f"{chunk.where}:{chunk.first + k}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                out.append(
                    (where, "", _Bad("invalid_utf8", f"{where}: invalid UTF-8 at byte {e.start} of the line"))
                )
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as e:
                reason = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
                out.append((where, line, _Bad("malformed_json", f"{where}: malformed JSON: {reason}")))
                continue
            if not isinstance(record, dict):
                message = f"{where}: the line is {_json_type(record)}, not a JSON object"
                out.append((where, line, _Bad("malformed_json", message)))
            else:
                out.append((where, line, record))
        return out

    def _lines(self, chunk: Chunk) -> list[str | _Bad]:
        out: list[str | _Bad] = []
        name = self.spec.text_field
        for where, line, record in self._objects(chunk):
            if isinstance(record, _Bad):
                out.append(record)
            elif name not in record:
                keys = ", ".join(list(record)[:8])
                out.append(_Bad("missing_field", f"{where}: no {name!r} field (keys: {keys})"))
            elif not isinstance(record[name], str):
                out.append(
                    _Bad("not_a_string", f"{where}: {name!r} is {_json_type(record[name])}, not a string")
                )
            elif "\\u" in line and not _encodable(record[name]):
                out.append(
                    _Bad("invalid_utf8", f"{where}: {name!r} holds a lone surrogate (\\ud800-\\udfff)")
                )
            else:
                out.append(record[name])
        return out

    def _rows(self, chunk: Chunk) -> list[str | _Bad]:
        column = chunk.payload
        try:
            values = column.to_pylist()
        except UnicodeDecodeError:  # find the row: convert one at a time
            values = []
            for j in range(len(column)):
                try:
                    values.append(column[j].as_py())
                except UnicodeDecodeError as e:
                    values.append(e.object if isinstance(e.object, bytes) else b"\xff")
        out: list[str | _Bad] = []
        for j, value in enumerate(values):
            where = f"{chunk.where}: row {chunk.first + j}"
            if value is None:
                out.append(_Bad("not_a_string", f"{where}: {self.spec.text_field!r} is null"))
            elif isinstance(value, bytes):
                out.append(_decode(value, where))
            else:
                out.append(value)
        return out

    # -- tokens -------------------------------------------------------------------------------------

    def _ids(self, texts: list[str]) -> list[Any]:
        if self.tok is None:
            return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]
        batch = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        return [e.ids for e in batch(texts, add_special_tokens=False)]

    def _tokens(self, texts: list[str]) -> np.ndarray:
        ids = self._ids(texts)
        bos = self.spec.bos_id
        extra = 1 if bos is None else 2
        out = np.empty(sum(len(x) for x in ids) + extra * len(ids), dtype=np.int64)
        pos = 0
        for doc in ids:
            if bos is not None:
                out[pos] = bos
                pos += 1
            out[pos : pos + len(doc)] = doc
            pos += len(doc)
            out[pos] = self.spec.eos_id
            pos += 1
        return _in_vocab(out, self.spec.vocab_size).astype(self.dtype)

    # -- conversations ------------------------------------------------------------------------------

    def _encode_chat(self, chunk: Chunk, chat: ChatSpec) -> ChunkResult:
        empty = np.empty(0, dtype=self.dtype)
        result = ChunkResult(empty, mask=np.empty(0, dtype=np.uint8), lengths=[])
        items: list[tuple[str, str, dict[str, Any] | _Bad]]
        if chunk.kind == PROBLEM:
            assert chunk.problem is not None
            items = [(chunk.where, "", _Bad(*chunk.problem))]
        else:
            assert chunk.kind == LINES, chunk.kind  # prepare_data refuses other inputs for chat
            items = self._objects(chunk)
        tokens: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        for where, _, record in items:
            try:
                if isinstance(record, _Bad):
                    raise record
                encoded = self._conversation(record, where, chat)
            except _Bad as bad:
                if not self.spec.skip_bad:
                    return ChunkResult(empty, error=bad.message)
                result.skipped[bad.kind] = result.skipped.get(bad.kind, 0) + 1
                if len(result.examples) < EXAMPLES_KEPT:
                    result.examples.append(bad.message)
                continue
            except TemplateRefused as e:  # the template itself: no record is to blame, --skip-bad or not
                return ChunkResult(empty, error=f"{where}: {e}")
            except DataError as e:  # a panic inside the tokenizer
                return ChunkResult(empty, error=str(e))
            tokens.append(encoded.tokens)
            masks.append(encoded.mask)
        if tokens:
            result.tokens = _in_vocab(np.concatenate(tokens), self.spec.vocab_size).astype(self.dtype)
            result.mask = np.concatenate(masks)
        result.lengths = [t.size for t in tokens]
        result.documents = len(tokens)
        return result

    def _conversation(self, record: dict[str, Any], where: str, chat: ChatSpec) -> Any:
        assert self.template is not None
        try:
            pieces = segments(self.template, conversation(record, where))
        except BadConversation as e:
            raise _Bad(e.kind, e.message) from None
        except TemplateFailed as e:
            raise _Bad("chat_template", f"{where}: {e}") from None
        if not all(_encodable(text) for text, _ in pieces):
            raise _Bad("invalid_utf8", f"{where}: the conversation holds a lone surrogate (\\ud800-\\udfff)")
        with native_calls(f"{where}: tokenizing"):
            encoded = encode_conversation(pieces, self._ids, self.spec.bos_id, self.spec.eos_id)
        if encoded.tokens.size > chat.seq_len:
            raise _Bad(
                "conversation_too_long",
                f"{where}: the conversation is {encoded.tokens.size} tokens (with its EOS), more than the "
                f"--seq-len {chat.seq_len} window it must fit in whole",
            )
        return encoded


def _in_vocab(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    if tokens.size and (int(tokens.max()) >= vocab_size or int(tokens.min()) < 0):
        raise ValueError(f"the tokenizer produced an id outside its vocab_size {vocab_size}")
    return tokens


def _decode(data: bytes, where: str) -> str | _Bad:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return _Bad("invalid_utf8", f"{where}: not valid UTF-8 (byte {e.start}: {e.reason})")


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}.get(
        type(value), "an object"
    )


_ENCODER: Encoder | None = None


def init_worker(spec: EncoderSpec, in_subprocess: bool = True) -> None:
    """Per process: one tokenizer, used single-threaded (the parallelism is the worker processes)."""
    global _ENCODER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if in_subprocess:  # it dies with its parent: data/pipeline.py (core/parent_death.py)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    _ENCODER = Encoder(spec)


def encode_chunk(chunk: Chunk) -> ChunkResult:
    assert _ENCODER is not None, "init_worker was not called in this process"
    return _ENCODER.encode(chunk)
