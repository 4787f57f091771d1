"""`prepare_data`: tokenize a corpus into `.npy` shards plus a self-describing `meta.json`.

The main process reads the inputs as chunks (data/readers.py), `workers` processes tokenize them
(data/encode.py), and the results come back in input order (data/pipeline.py), so the shards are the same
bytes for any number of workers. Shards are written through temp names and renamed; after each one the
resume journal (data/journal.py) records where the next begins, and meta.json, written last, marks the
directory complete. A bad record stops the run with one line naming its file and line/row, and removes
what was written; with `skip_bad` it is skipped and counted in meta.json instead. With `chat`, records are
conversations: tokens and a loss mask per conversation (data/chat.py), packed whole into windows by the
main process (data/packing.py), written as token shards with a mask shard beside each.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from truestep.data.atomic import atomic_write_bytes
from truestep.data.bos import resolve_bos
from truestep.data.chat_prepare import (
    ChatOptions,
    chat_bos,
    chat_meta,
    chat_settings,
    chat_spec,
    packer,
    pad_id,
)
from truestep.data.encode import EXAMPLES_KEPT, Encoder, EncoderSpec, encode_chunk, init_worker
from truestep.data.errors import DataError
from truestep.data.inputs import InputFile, expand_inputs
from truestep.data.journal import Counters, Journal, read_journal, tail_problem, write_journal
from truestep.data.meta import FORMAT, JOURNAL_NAME, META_NAME, VERSION, dtype_for_vocab
from truestep.data.outdir import ShardWriter, claim_out_dir, is_replaceable_dir
from truestep.data.packing import Packer
from truestep.data.pipeline import ordered_map
from truestep.data.readers import CHUNK_BYTES, Chunk, Cursor, read_chunks
from truestep.data.tokenizer import HFTokenizer, load_tokenizer
from truestep.data.tokenizer_files import TOKENIZER_JSON, read_tokenizer_files, write_tokenizer_files

__all__ = ["DEFAULT_SHARD_TOKENS", "ChatOptions", "PrepareProgress", "is_replaceable_dir", "prepare_data"]

DEFAULT_SHARD_TOKENS = 16_777_216  # 32 MiB per shard at uint16: few files, cheap to hash and mmap


@dataclass(frozen=True)
class PrepareProgress:
    documents: int
    tokens: int
    done_bytes: int
    total_bytes: int


def _settings(inputs: list[InputFile], spec: EncoderSpec, shard_tokens: int, tokenizer_sha: str) -> dict:
    """What a resumed run must share with the interrupted one for its shards to be the same (chat data:
    also `chat`, data/chat_prepare.py)."""
    return {
        "version": VERSION,
        "inputs": [item.identity() for item in inputs],
        "tokenizer_sha256": tokenizer_sha,
        "eos_id": spec.eos_id,
        "bos_id": spec.bos_id,
        "text_field": spec.text_field,
        "skip_bad": spec.skip_bad,
        "shard_tokens": shard_tokens,
        "chunk_bytes": CHUNK_BYTES,
    }


def _describe(chunk: Chunk) -> str:
    """A chunk in a worker's last words: its file and first line (JSONL) or row (Arrow)."""
    return f"{chunk.where} (from line/row {chunk.first})"


def _start(
    out_dir: Path, settings: dict, resume: bool, log: Callable[[str], None], reread: Callable[[Journal], Any]
) -> Journal | None:
    """Claim `out_dir`; the journal of an interrupted run with the same settings, if resuming and it holds
    (data/journal.py: its shards, and `reread(cursor)`, the tokens at its position, checked)."""
    journal = None
    if (
        resume
        and out_dir.is_dir()
        and (out_dir / JOURNAL_NAME).is_file()
        and not (out_dir / META_NAME).exists()
    ):
        journal, why = read_journal(out_dir, settings)
        problem = tail_problem(out_dir, journal, reread(journal)) if journal is not None else None
        if journal is None or problem is not None:
            journal = None
            log(
                f"an interrupted prepare-data left {out_dir} behind but cannot be resumed ({problem or why}): "
                "starting over"
            )
        else:
            log(f"resuming the interrupted prepare-data in {out_dir} after {len(journal.shards)} shard(s)")
    keep = (
        {JOURNAL_NAME, *(str(e[k]) for e in journal.shards for k in ("file", "mask") if k in e)}
        if journal
        else set()
    )
    claim_out_dir(out_dir, keep)
    return journal


def _tokens_at(inputs: list[InputFile], spec: EncoderSpec, settings: dict) -> Callable[[Journal], Any]:
    """The tokens (and chat data's mask, packed from the journal's block fill) of the chunk that starts
    at the journal's cursor, encoded again (None: none, or a bad record)."""

    def reread(journal: Journal) -> Any:
        chunk = next(read_chunks(inputs, spec.text_field, journal.cursor), None)
        if chunk is None or chunk.cursor != journal.cursor:
            return None
        result = Encoder(spec).encode(chunk)
        if result.error is not None:
            return None
        if spec.chat is None:
            return result.tokens, None
        assert result.mask is not None and result.lengths is not None
        return packer(settings, journal.counters.block_fill).pack(result.tokens, result.mask, result.lengths)

    return reread


def prepare_data(
    text_files: list[Path] | list[str],
    out_dir: Path,
    tokenizer_spec: str = "byte",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    eos_token: str | None = None,
    *,
    text_field: str = "text",
    workers: int = 1,
    skip_bad: bool = False,
    bos: str = "auto",
    resume: bool = True,
    progress: Callable[[PrepareProgress], None] | None = None,
    log: Callable[[str], None] | None = None,
    chat: ChatOptions | None = None,
) -> Path:
    """Tokenize the inputs (files, directories, globs: data/inputs.py) into shards under `out_dir`.

    Every document becomes [BOS] tokens EOS (BOS per `bos`: data/bos.py). Returns `out_dir`. The stream
    order is the order of the inputs (each directory and glob sorted). `resume`: continue an interrupted
    run with the same inputs and settings instead of starting over. `chat`: the inputs are conversations
    (JSON lines), written with loss masks and packed into windows of `chat.seq_len` tokens.
    """
    if shard_tokens <= 0:
        raise DataError(f"shard_tokens must be positive, got {shard_tokens}")
    if workers < 1:
        raise DataError(f"workers must be at least 1, got {workers}")
    log = log or (lambda line: None)
    inputs = expand_inputs(list(text_files))
    is_byte = tokenizer_spec == "byte"
    # Read now, once: claiming out_dir below clears a previous copy, which may be the tokenizer given
    # here; and what is loaded (and checked) is what the workers get and what is copied.
    tokenizer_bytes = {} if is_byte else read_tokenizer_files(Path(tokenizer_spec))
    tok = (
        load_tokenizer(tokenizer_spec, eos_token=eos_token)
        if is_byte
        else HFTokenizer(tokenizer_spec, eos_token=eos_token, files=tokenizer_bytes)
    )
    tokenizer_json = None if is_byte else tokenizer_bytes[TOKENIZER_JSON]
    dtype = dtype_for_vocab(tok.vocab_size)
    spec = EncoderSpec(
        tokenizer_json=None if tokenizer_json is None else tokenizer_json.decode("utf-8"),
        vocab_size=int(tok.vocab_size),
        eos_id=int(tok.eos_id),
        bos_id=resolve_bos(tok, bos) if chat is None else chat_bos(tok, bos),
        text_field=text_field,
        skip_bad=skip_bad,
        dtype=dtype.name,
        chat=None if chat is None else chat_spec(chat, inputs, tok, tokenizer_bytes),
    )
    sha = "byte" if tokenizer_json is None else hashlib.sha256(tokenizer_json).hexdigest()
    settings = _settings(inputs, spec, shard_tokens, sha)
    if chat is not None and spec.chat is not None:
        settings["chat"] = chat_settings(spec.chat, chat, pad_id(tok))
    out_dir = Path(out_dir)
    journal = _start(out_dir, settings, resume, log, _tokens_at(inputs, spec, settings))
    masked = spec.chat is not None
    writer = ShardWriter(out_dir, dtype, shard_tokens, journal.shards if journal else None, masked)
    counters = journal.counters if journal else Counters()
    pack: Packer | None = packer(settings, counters.block_fill) if masked else None
    skip = journal.skip_tokens if journal else 0
    total_bytes = sum(item.size for item in inputs)
    submitted: deque[Chunk] = deque()

    def chunks() -> Iterator[Chunk]:
        for chunk in read_chunks(inputs, text_field, journal.cursor if journal else Cursor()):
            submitted.append(chunk)
            yield chunk

    tokenizer_files: list[str] = []
    try:
        for result in ordered_map(encode_chunk, chunks(), workers, init_worker, (spec,), _describe):
            chunk = submitted.popleft()
            if result.error is not None:
                raise DataError(result.error)
            fill = 0 if pack is None else pack.fill
            before = Counters(counters.documents, dict(counters.skipped), list(counters.examples), fill)
            tokens, mask = result.tokens, None
            if pack is not None:
                assert result.mask is not None and result.lengths is not None
                tokens, mask = pack.pack(result.tokens, result.mask, result.lengths)
            drop = min(skip, tokens.size)  # a resumed run's first tokens are in shards already
            skip -= drop

            def on_shard(
                used: int, chunk: Chunk = chunk, drop: int = drop, before: Counters = before
            ) -> None:
                write_journal(out_dir, Journal(settings, writer.shards, chunk.cursor, drop + used, before))

            writer.add(tokens[drop:], on_shard, None if mask is None else mask[drop:])
            counters.documents += result.documents
            for kind, count in result.skipped.items():
                counters.skipped[kind] = counters.skipped.get(kind, 0) + count
            counters.examples += result.examples[: max(0, EXAMPLES_KEPT - len(counters.examples))]
            if progress is not None:
                tokens = writer.num_tokens + writer.pending_len
                progress(PrepareProgress(counters.documents, tokens, chunk.done_bytes, total_bytes))
        if pack is not None and counters.documents:
            writer.add(*_with_mask(pack.finish()))
        writer.flush()
        if not writer.num_tokens:
            raise DataError(
                "the inputs hold no documents"
                + (f" (every record was bad and skipped: {counters.skipped})" if counters.skipped else "")
            )
        # The tokenizer is copied in and named relative to out_dir, so it travels with the data.
        tokenizer_files = write_tokenizer_files(tokenizer_bytes, out_dir)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": "byte" if is_byte else TOKENIZER_JSON,
            **({"tokenizer_files": tokenizer_files} if tokenizer_files else {}),
            "vocab_size": spec.vocab_size,
            "eos_id": spec.eos_id,
            "bos_id": tok.bos_id,
            "pad_id": tok.pad_id,
            "add_bos": spec.bos_id is not None,
            "dtype": dtype.name,
            "num_tokens": writer.num_tokens,
            "shards": writer.shards,
            "documents": counters.documents,
            "text_field": text_field,
            "inputs": [{k: v for k, v in item.identity().items() if k != "mtime_ns"} for item in inputs],
            "skipped": counters.skipped,
            "skipped_examples": counters.examples,
        }
        if masked:
            meta["chat"] = chat_meta(settings, counters.documents, _trained(out_dir, writer.shards))
        # Written last: its presence is what marks the directory complete.
        atomic_write_bytes(out_dir / META_NAME, (json.dumps(meta, indent=2) + "\n").encode("utf-8"))
        (out_dir / JOURNAL_NAME).unlink(missing_ok=True)
    except KeyboardInterrupt:
        # The shards written so far are complete and the journal says where they end: the same command
        # resumes. Without meta.json the directory is never taken for a finished one.
        raise
    except BaseException:
        writer.remove_written()
        for name in (*tokenizer_files, JOURNAL_NAME):
            (out_dir / name).unlink(missing_ok=True)
        raise
    return out_dir


def _with_mask(packed: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, None, np.ndarray]:
    """`writer.add`'s arguments for packed tokens and mask (no journal between shards of the padding: a
    shard it fills is written, and the next run resumes from the last journal, before it)."""
    return packed[0], None, packed[1]


def _trained(out_dir: Path, shards: list[dict[str, Any]]) -> int:
    """Tokens the masks train, over all mask shards."""
    return sum(int(np.load(out_dir / e["mask"], mmap_mode="r", allow_pickle=False).sum()) for e in shards)
