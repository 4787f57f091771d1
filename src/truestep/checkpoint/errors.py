"""The checkpoint room's refusals, in a module of their own so every checkpoint module can raise them
without importing the resolver (which imports most of them)."""

from __future__ import annotations

from truestep.core.errors import RefusedError


class ResumeError(RefusedError):
    """Resuming is impossible or unsafe; the message says what to do."""


class CheckpointNotFound(RefusedError):
    """A path given as a checkpoint holds no checkpoint that verifies."""


class SetAsideError(RefusedError):
    """A checkpoint could not be moved to quarantine/ or superseded/ (e.g. that name is a file)."""


class CheckpointContentError(RefusedError):
    """A checkpoint's bytes contradict its own metadata or are unsafe to read (a storage path outside the
    directory, a FIFO, a tensor stored in another dtype or shape than declared, bytes that do not load).
    The checkpoint itself is bad: a resume quarantines it and falls back to an older one."""


class TensorMismatchError(RefusedError):
    """A checkpoint's tensors do not fit what is being loaded (another model config): the checkpoint may
    be fine, the request does not match it."""


def raise_load_error(ckpt_dir: object, err: BaseException) -> None:
    """Raise a failed load as the refusal it is: the checkpoint's own bytes (CheckpointContentError, raised
    as is: the caller quarantines and falls back), a model that does not fit it, or an I/O error."""
    if isinstance(err, RefusedError | OSError) and not isinstance(err, TensorMismatchError):
        raise err
    if isinstance(err, TensorMismatchError):
        raise ResumeError(
            f"{ckpt_dir} does not fit the configured model ({err}); the config changed in a way that changes "
            "shapes: restore it or start a new run directory"
        ) from err
    raise ResumeError(
        f"{ckpt_dir} cannot be loaded into the configured model: {type(err).__name__}: {err}"
    ) from err
