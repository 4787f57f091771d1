"""A model's chat template, rendered as the input it is: sandboxed (data/chat_sandbox.py), and bounded in
size and time.

Bounds, because a template can loop or allocate without end:
- the source is at most MAX_TEMPLATE_CHARS; one conversation's renders together at most MAX_RENDER_SECONDS
  (a timer interrupts any Python-level loop on a process's main thread, where prepare-data and its
  workers render; every call, attribute, item and operator the template evaluates also checks the
  deadline, which is what bounds a render elsewhere);
- the sandbox's own bounds on `range`, arguments, repetition and powers (data/chat_sandbox.py);
- one render's output is at most MAX_OUTPUT_CHARS (counted while it streams).
A template that breaks the sandbox or a bound is refused as a whole (`TemplateRefused`: the run stops,
exit 3, whatever --skip-bad says); one that fails on a conversation (`raise_exception`, an undefined
value, a type error) refuses that conversation (`TemplateFailed`: a bad record).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from truestep.data.chat_sandbox import (
    MAX_OUTPUT_CHARS,
    MAX_RANGE_ITEMS,
    Bound,
    Overrun,
    TemplateFailed,
    TemplateRefused,
    environment,
)
from truestep.data.errors import DataError, DataUsageError

__all__ = ["ChatTemplate", "TemplateFailed", "TemplateRefused", "special_token_texts", "template_source"]

MAX_TEMPLATE_CHARS = 1 << 20
"""Real chat templates are a few KB (the largest on the Hub some tens of KB)."""
MAX_RENDER_SECONDS = 10.0
"""For all renders of one conversation together (a real one takes milliseconds)."""
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
"""What transformers hands a template besides the messages (its special tokens map)."""


@contextmanager
def _timer(seconds: float) -> Iterator[None]:
    """SIGALRM after `seconds` raises Overrun in the render (main thread only: elsewhere the sandbox's
    own deadline checks are the bound)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    armed = [True]

    def on_alarm(signum: int, frame: Any) -> None:
        if armed[0]:
            raise Overrun

    previous = signal.signal(signal.SIGALRM, on_alarm)
    # Again every 50 ms once due: one alarm swallowed by a broad `except` inside jinja is not the end.
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class ChatTemplate:
    """A compiled chat template and the special tokens it is handed."""

    def __init__(self, source: str, special_tokens: dict[str, str], where: str = "the chat template") -> None:
        if len(source) > MAX_TEMPLATE_CHARS:
            raise TemplateRefused(
                f"{where} has {len(source)} characters, more than a chat template's {MAX_TEMPLATE_CHARS}"
            )
        bounded, jinja2, self._security = environment()
        self.where = where
        self.env = bounded()
        try:
            self.template = self.env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateRefused(f"{where} does not compile: {e.message} (line {e.lineno})") from None
        except (jinja2.TemplateError, RecursionError) as e:
            raise TemplateRefused(f"{where} does not compile: {' '.join(str(e).split())[:300]}") from None
        self.special_tokens = dict(special_tokens)
        self._errors = (
            jinja2.TemplateError,
            TypeError,
            ValueError,
            LookupError,
            ArithmeticError,
            AttributeError,
        )

    @contextmanager
    def conversation(self) -> Iterator[None]:
        """The bounds of one conversation's renders: one deadline, one range budget."""
        self.env.deadline = time.monotonic() + MAX_RENDER_SECONDS
        self.env.range_left = MAX_RANGE_ITEMS
        try:
            with _timer(MAX_RENDER_SECONDS):
                yield
        except Overrun:
            raise TemplateRefused(
                f"{self.where} ran longer than {MAX_RENDER_SECONDS:g} s on one conversation: refusing it "
                "(a template is input; a real one renders in milliseconds)"
            ) from None
        finally:
            self.env.deadline = float("inf")

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The text of `messages` (inside `conversation()`). TemplateRefused / TemplateFailed."""
        context = {
            **self.special_tokens,
            "messages": messages,
            "tools": None,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        pieces: list[str] = []
        size = 0
        try:
            for piece in self.template.generate(context):
                size += len(piece)
                if size > MAX_OUTPUT_CHARS:
                    raise Bound(f"a render longer than {MAX_OUTPUT_CHARS} characters")
                pieces.append(piece)
        except self._security as e:
            raise TemplateRefused(
                f"{self.where} broke the sandbox: {' '.join(str(e).split())[:300]}"
            ) from None
        except Bound as e:
            raise TemplateRefused(f"{self.where} is over a bound: {e}") from None
        except (RecursionError, MemoryError) as e:
            raise TemplateRefused(f"{self.where} is over a bound: {type(e).__name__}") from None
        except TemplateFailed:
            raise
        except self._errors as e:
            raise TemplateFailed(
                f"the chat template fails on it: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
            ) from None
        return "".join(pieces)


def template_source(files: dict[str, bytes], where: str) -> tuple[str, str]:
    """(the chat template, where it came from) of a tokenizer's files (data/tokenizer_files.py):
    chat_template.jinja when there is one (transformers 5 writes it there and prefers it), else the
    `chat_template` of tokenizer_config.json (a string, or a list of named templates: the one named
    "default"). DataUsageError when it has none."""
    from truestep.data.tokenizer import TOKENIZER_CONFIG
    from truestep.data.tokenizer_files import CHAT_TEMPLATE
    from truestep.data.tokenizer_read import parse_json_object

    if CHAT_TEMPLATE in files:
        try:
            return files[CHAT_TEMPLATE].decode("utf-8"), f"{where}/{CHAT_TEMPLATE}"
        except UnicodeDecodeError:
            raise DataError(f"{where}/{CHAT_TEMPLATE} is not UTF-8 text") from None
    config = (
        parse_json_object(files[TOKENIZER_CONFIG], f"{where}/{TOKENIZER_CONFIG}")
        if TOKENIZER_CONFIG in files
        else {}
    )
    value = config.get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if not isinstance(value, str):
        raise DataUsageError(
            f"the tokenizer in {where} has no chat template (no {CHAT_TEMPLATE}, no chat_template in "
            f"{TOKENIZER_CONFIG}): --chat renders conversations with the model's own template"
        )
    return value, f"{where}/{TOKENIZER_CONFIG} chat_template"


def special_token_texts(files: dict[str, bytes], where: str) -> dict[str, str]:
    """bos/eos/unk/pad token text as tokenizer_config.json and special_tokens_map.json name them (the map
    wins, as transformers reads them): what a template sees as `bos_token`, `eos_token`, ..."""
    from truestep.data.tokenizer import TOKENIZER_CONFIG
    from truestep.data.tokenizer_files import SPECIAL_TOKENS_MAP
    from truestep.data.tokenizer_read import parse_json_object

    found: dict[str, str] = {}
    for name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
        if name not in files:
            continue
        config = parse_json_object(files[name], f"{where}/{name}")
        for key in SPECIAL_TOKEN_NAMES:
            value = config.get(key)
            text = value.get("content") if isinstance(value, dict) else value
            if isinstance(text, str):
                found[key] = text
    return found
