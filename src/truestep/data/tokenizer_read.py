"""Reading a tokenizer's files: the tokenizer.json a user names and the companions beside it
(tokenizer_config.json, special_tokens_map.json, chat_template.jinja, generation_config.json).

A tokenizer folder is often someone else's (a cloned repository, an unpacked archive), and whatever is
read here travels on: into the data directory, and from there into every export of a model trained on
it. So each file is read only when its real path stays inside the folder the tokenizer.json is in (or,
for a Hugging Face cache snapshot, that repository's blobs: core/outside.py), never from a FIFO or a
device, and at most TOKENIZER_FILE_LIMIT bytes; anything else is one line naming the file (exit 3).
"""

from __future__ import annotations

from pathlib import Path

from truestep.core.fsio import OversizeFileError, UnsafePathError, read_regular
from truestep.core.outside import OutsideJsonError, UnconfinedPathError, confined, loads_bounded
from truestep.data.errors import DataError

TOKENIZER_FILE_LIMIT = 64 << 20
"""A tokenizer.json is at most tens of MB, its companions kilobytes to a few MB (a chat template inside
tokenizer_config.json): a larger file is not one (the same bound as `import-hf`)."""


def read_tokenizer_file(path: Path, root: Path) -> bytes | None:
    """The bytes of `path`, a file of the tokenizer folder `root`; None when it does not exist. DataError
    (one line naming it) when it resolves outside `root`, is not a regular file, or is too large."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return read_regular(confined(path, root), TOKENIZER_FILE_LIMIT)
    except UnconfinedPathError as err:
        raise DataError(str(err)) from None
    except FileNotFoundError:
        raise DataError(f"tokenizer file {path} is a dangling symlink") from None
    except OversizeFileError as err:
        raise DataError(str(err)) from None
    except UnsafePathError as err:
        raise DataError(f"tokenizer file {path}: {err.strerror}") from None
    except OSError as err:
        raise DataError(f"cannot read tokenizer file {path}: {err.strerror or err}") from None


def parse_json_object(data: bytes, where: Path | str) -> dict:
    """`data` (a JSON companion) as an object; DataError (one line) when it is not a JSON object within
    bounds (nesting, an over-long integer, NaN or Infinity: companions travel into exports, which write
    strict JSON)."""
    try:
        value = loads_bounded(data, str(where))
    except OutsideJsonError as err:
        raise DataError(str(err)) from None
    if not isinstance(value, dict):
        raise DataError(f"{where} is not a JSON object")
    return value


def read_tokenizer_json_object(path: Path, root: Path) -> dict | None:
    """A JSON companion (tokenizer_config.json, ...) of the folder `root` as an object; None when it does
    not exist; DataError as `read_tokenizer_file` and `parse_json_object` say."""
    data = read_tokenizer_file(path, root)
    return None if data is None else parse_json_object(data, path)
