"""Telling a peer that left from a bug: the collective that fails because another rank is gone.

When one rank dies (killed, preempted first, crashed), every collective the others are in raises
gloo's plain RuntimeError ("Connection closed by peer", "Connection reset by peer") or an NCCL remote
error. That is the expected echo of a failure the supervisor detects and handles on its own, not a bug
of this rank: it earns one line on stderr and its traceback in the event log (and with --debug), not a
68-line torch traceback on the console.
"""

from __future__ import annotations

PEER_GONE_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote process exited or there was a network error",
)
"""Substrings of the messages gloo / NCCL raise when the other end of a collective is gone."""


def peer_left(err: BaseException) -> str | None:
    """The first line of `err`'s message when it says a peer of a collective is gone; else None."""
    if not isinstance(err, RuntimeError):
        return None
    message = str(err)
    if not any(marker in message for marker in PEER_GONE_MARKERS):
        return None
    first = message.splitlines()[0].split("] ", 1)[-1]  # drop gloo's "[/path/pair.cc:553] " source prefix
    return first.split(". ", 1)[
        0
    ]  # gloo's advice ("typically caused by a remote worker crashing") is ours to say
