"""The jinja2 sandbox a chat template renders in (data/chat_template.py compiles and runs templates in it).

`environment()` builds, on first use, a subclass of jinja2's `ImmutableSandboxedEnvironment` (no
`__class__`/`__globals__`, no unsafe callables, no mutation of lists and dicts) with transformers'
conventions (`trim_blocks`, `lstrip_blocks`, `loopcontrols`, the `{% generation %}` tag,
`raise_exception`, a `tojson` that does not HTML-escape, `namespace` refusing underscore names), so it
renders what `apply_chat_template` renders. `strftime_now` is not given: a render that depends on the day
would make the shards depend on it (templates that use it fall back to a fixed date when it is undefined,
as Llama 3.1's does).

Its bounds, because a template can loop or allocate without end: every call, attribute, item and
operator the template evaluates checks the environment's `deadline` (raising `Overrun`); `range` draws
at most MAX_RANGE_ITEMS numbers per conversation; no call or filter argument may exceed MAX_ARGUMENT; no
repetition (`'x' * n`) or concatenation may exceed MAX_OUTPUT_CHARS; `**` is bounded; a `format` width
taken from an argument or of a million or more is refused; `lipsum` is gone. A bound hit raises `Bound`;
an unsafe attribute raises jinja2's SecurityError at once (jinja would otherwise hand back an Undefined
that prints as "").
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable
from typing import Any

from truestep.data.errors import DataError, DataUsageError

MAX_RANGE_ITEMS = 1_000_000
MAX_ARGUMENT = 1 << 16
"""The largest integer a call or a filter may be given (a width, a count): `center(10**9)` is a bomb."""
MAX_OUTPUT_CHARS = 64 << 20
"""One render's text, and the longest string or list one operation may build."""
MAX_EXPONENT = 1024
MIN_JINJA = (3, 1, 6)
"""Older jinja2 releases have known sandbox escapes (transformers refuses them too)."""


class TemplateRefused(DataError):
    """The template broke the sandbox or a bound: the whole run is refused (exit 3)."""


class TemplateFailed(Exception):
    """The template refused or failed on one conversation (a bad record, skippable)."""


class Overrun(Exception):
    """The deadline of a conversation's renders passed."""


class Bound(Exception):
    """A bound of the sandbox was hit (turned into TemplateRefused)."""


def _jinja() -> Any:
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError:
        raise DataUsageError(
            "chat data needs the `jinja2` package to render the chat template: pip install 'truestep[hf]'"
        ) from None
    version = tuple(int(p) for p in re.findall(r"\d+", jinja2.__version__)[:3])
    if version < MIN_JINJA:
        raise DataUsageError(
            f"jinja2 {jinja2.__version__} has known sandbox escapes; chat templates need jinja2>=3.1.6"
        )
    return jinja2


def _check_argument(value: Any, what: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_ARGUMENT:
        raise Bound(f"{what} was given {value}, over the bound of {MAX_ARGUMENT}")


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, str | list | tuple) else 0


def environment() -> Any:
    """The sandbox class, built on first use (jinja2 is imported only for chat data)."""
    jinja2 = _jinja()
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class Generation(Extension):
        """transformers' `{% generation %}...{% endgeneration %}`: the body, rendered as it is (the turns
        are told apart by rendering prefixes, data/chat.py, not by these marks)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's signature trick: `self` may be a key
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise SecurityError(f"a namespace may not hold the underscore name {name!r}")

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def __init__(self) -> None:
            super().__init__(
                trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
            )
            self.deadline = float("inf")
            self.range_left = MAX_RANGE_ITEMS
            self.globals.pop("lipsum", None)
            self.globals.update(
                raise_exception=_raise_exception, range=self._range, namespace=Namespace, dict=_plain_dict
            )
            self.filters["tojson"] = _tojson
            for name, f in list(self.filters.items()):
                self.filters[name] = _bounded_filter(name, f)

        def tick(self) -> None:
            if time.monotonic() > self.deadline:
                raise Overrun

        def _range(self, *args: int) -> range:
            self.tick()
            numbers = range(*args)
            self.range_left -= len(numbers)
            if self.range_left < 0:
                raise Bound(f"range() drew more than {MAX_RANGE_ITEMS} numbers for one conversation")
            return numbers

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            __self.tick()
            if __obj is not __self.globals["range"]:  # range is bounded by its own budget
                for value in (*args, *kwargs.values()):
                    _check_argument(value, f"a call of {getattr(__obj, '__name__', 'a function')}")
            return super().call(__context, __obj, *args, **kwargs)

        def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
            # jinja hands back an Undefined that fails only when used: printed, it is "" and the attempt
            # would pass unseen. A template that reaches for an unsafe attribute is refused, here.
            raise SecurityError(
                f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
            )

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)
            if wrapped is not None and _WIDE_FORMAT.search(value.__self__):
                raise Bound(f"str.format with the format {value.__self__[:40]!r}")
            return wrapped

        def getattr(self, obj: Any, attribute: str) -> Any:
            self.tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            self.tick()
            return super().getitem(obj, argument)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            self.tick()
            if operator == "*":
                counts = [v for v in (left, right) if isinstance(v, int) and not isinstance(v, bool)]
                size = max(_sized(left), _sized(right))
                if size and counts and size * max(counts[0], 0) > MAX_OUTPUT_CHARS:
                    raise Bound(f"a repetition of {size} items {counts[0]} times")
                if len(counts) == 2 and left.bit_length() + right.bit_length() > 4 * MAX_EXPONENT:
                    raise Bound("a product of integers too large")
            elif operator == "**":
                if isinstance(right, int | float) and abs(right) > MAX_EXPONENT:
                    raise Bound(f"a power of {right}")
            elif operator == "+" and _sized(left) + _sized(right) > MAX_OUTPUT_CHARS:
                raise Bound(f"a concatenation longer than {MAX_OUTPUT_CHARS}")
            elif operator == "%" and isinstance(left, str) and _WIDE_PERCENT.search(left):
                raise Bound(f"the format {left[:40]!r}")
            return super().call_binop(context, operator, left, right)

    return Bounded, jinja2, SecurityError


_WIDE_FORMAT = re.compile(r"\d{6,}|\{[^{}]*\{")
"""A width or precision of a million or more, or one taken from an argument (`{:{}}`)."""
_WIDE_PERCENT = re.compile(r"\d{6,}|%[^a-zA-Z%]*\*")


def _plain_dict(*args: Any, **kwargs: Any) -> dict[Any, Any]:
    """`dict(...)` for templates, without the type itself (transformers hands them the same)."""
    return dict(*args, **kwargs)


def _raise_exception(message: Any) -> None:
    raise TemplateFailed(f"the chat template refuses it: {' '.join(str(message).split())[:300]}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """transformers' tojson: plain json.dumps (Jinja's own escapes <, >, & for HTML)."""
    if indent is not None and not 0 <= int(indent) <= 16:
        raise Bound(f"tojson indent {indent}")
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _bounded_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """`f` with its integer arguments bounded, and for `format` its format string: a width in it builds
    a string of that many characters before anything can count them."""

    @functools.wraps(f)  # keeps jinja's pass_context/pass_environment marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        for value in (*args, *kwargs.values()):
            _check_argument(value, f"the filter {name}")
        if name == "format" and args and isinstance(args[0], str) and _WIDE_PERCENT.search(args[0]):
            raise Bound(f"the filter format was given the format {args[0][:40]!r}")
        return f(*args, **kwargs)

    return bounded
