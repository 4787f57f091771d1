"""Reading what came from someone else: JSON parsed with bounds, and files confined to the directory they
were named in.

JSON: Python's parser recurses once per nesting level and raises RecursionError (not a ValueError) past
the interpreter's limit, turns a 5,000-digit number into a ValueError of its own, and accepts `NaN` and
`Infinity`, which are not JSON and which a strict reader elsewhere refuses. `loads_bounded` makes every
one of those one `OutsideJsonError` (a ValueError) naming the file. Size is bounded by the caller, which
reads at most so many bytes (`fsio.read_regular`).

Confinement: a directory a user names (a corpus, a tokenizer's folder, a cloned repository, an unpacked
archive) may carry symlinks to anywhere (`tokenizer_config.json -> ~/.ssh/id_rsa`). A file found in it
is read only when its real path stays inside that directory -- or, for a Hugging Face cache snapshot,
inside its repository's `blobs/`, where the cache's own links point. Anything else is refused with its
name (`UnconfinedPathError`, exit 3), never read or copied. Standard library only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from truestep.core.errors import RefusedError


class OutsideJsonError(ValueError):
    """Bytes from someone else are not JSON within bounds (one line: where and why)."""


class UnconfinedPathError(RefusedError):
    """A file named inside a directory resolves (through a symlink) to somewhere outside it."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_bounded(data: bytes | str, where: str, allow_nan: bool = False) -> Any:
    """`json.loads(data)`; OutsideJsonError naming `where` when it is not UTF-8 JSON, is nested deeper than
    the parser's recursion limit, holds an over-long integer, or (unless `allow_nan`) NaN or Infinity."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        if allow_nan:
            return json.loads(text)
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise OutsideJsonError(f"{where}: not valid JSON: RecursionError: nested too deeply") from None
    except (ValueError, TypeError) as err:  # JSONDecodeError, UnicodeDecodeError, int digits, constants
        reason = " ".join(str(err).split())[:200]
        raise OutsideJsonError(f"{where}: not valid JSON: {type(err).__name__}: {reason}") from None


def link_roots(directory: Path) -> list[Path]:
    """Where the files of `directory` may resolve to: inside it, and, for a Hugging Face cache snapshot
    (`.../models--org--name/snapshots/<commit>`), inside that repository's `blobs/`."""
    real = Path(os.path.realpath(directory))
    roots = [real]
    if real.parent.name == "snapshots":
        roots.append(real.parent.parent / "blobs")
    return roots


def confined(path: Path, root: Path | None = None) -> Path:
    """The real path of `path` (every symlink resolved) when it stays inside `root` (default: the
    directory `path` is in; itself resolved, so a directory named through a link is fine) or, for a cache
    snapshot, inside its blobs (`link_roots`); UnconfinedPathError naming `path` otherwise. Open the
    returned path without following links: it has none left, so a link planted later is refused."""
    base = path.parent if root is None else root
    real = Path(os.path.realpath(path))
    if not any(real.is_relative_to(r) for r in link_roots(base)):
        raise UnconfinedPathError(
            f"{path} resolves through a symlink to {real}, outside {base}: refusing to read it (a file is "
            "read only from inside the directory it was named in: copy it there, or name it directly)"
        )
    return real
