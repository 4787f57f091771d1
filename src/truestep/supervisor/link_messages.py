"""What an authenticated message on the node link may say: every field checked before it is acted on.

A message that proved the launch's key (supervisor/link_auth.py) comes from one of the job's own
supervisors -- but a field out of range is still a bug or a version skew, and is never acted on: the
hello names a node of this job, a beat the node that sent it, a goodbye an exit code from the known set
(core/errors.py: `ExitCode`, and the job's requeue code and the one above it), a loss record a node of
this job other than the receiver, and a way of being lost from `HOWS`. `LinkProtocolError` otherwise:
the connection is closed, as for any protocol error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from truestep.core.errors import ExitCode

HOWS = ("closed", "silent", "left", "never_joined", "unreachable", "rejected")
"""How a node can be lost (peers.NodeLoss.how)."""
TEXT_LIMIT = 1024
HOST_LIMIT = 255


class LinkProtocolError(ValueError):
    """An authenticated message whose fields are not what this protocol allows."""


def known_codes(requeue_code: int) -> frozenset[int]:
    """Exit codes a supervisor can end with: truestep's own, and the job's requeue code (+1: forced)."""
    return frozenset(int(c) for c in ExitCode) | {requeue_code, requeue_code + 1}


def _text(message: dict[str, Any], name: str, limit: int, default: str | None = None) -> str:
    value = message.get(name, default)
    if not isinstance(value, str) or len(value) > limit:
        raise LinkProtocolError(f"field {name!r} is not a string of at most {limit} characters")
    return value


def _int(message: dict[str, Any], name: str) -> int:
    value = message.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise LinkProtocolError(f"field {name!r} is not an integer")
    return value


def hello_problem(hello: dict[str, Any], job: str, generation: str, nnodes: int) -> str | None:
    """Why node 0 refuses this (authenticated) hello, or None."""
    if hello.get("type") != "hello":
        return f"not a hello: {str(hello.get('type'))[:40]!r}"
    if (hello.get("job"), hello.get("generation")) != (job, generation):
        return (
            f"it belongs to job {str(hello.get('job'))[:200]} launch {str(hello.get('generation'))[:40]}, "
            f"not job {job} launch {generation}"
        )
    if hello.get("nnodes") != nnodes:
        return f"it was started with --nnodes {str(hello.get('nnodes'))[:40]}, node 0 with {nnodes}"
    node = hello.get("node")
    if not isinstance(node, int) or isinstance(node, bool) or not 1 <= node < nnodes:
        return f"--node-rank {str(node)[:40]} is not in 1..{nnodes - 1}"
    if not isinstance(hello.get("host"), str) or len(hello["host"]) > HOST_LIMIT:
        return "its host name is not a string of at most 255 characters"
    return None


@dataclass(frozen=True)
class LostRecord:
    node: int
    host: str
    how: str
    detail: str
    code: int | None


@dataclass(frozen=True)
class Bye:
    code: int
    outcome: str
    lost: LostRecord | None


def check_beat(message: dict[str, Any], sender: int) -> None:
    if _int(message, "node") != sender:
        raise LinkProtocolError(f"a beat from node {sender} names node {str(message.get('node'))[:40]}")
    if not isinstance(message.get("time"), int | float) or isinstance(message.get("time"), bool):
        raise LinkProtocolError("a beat without its time")


def check_bye(message: dict[str, Any], sender: int, receiver: int, nnodes: int, requeue_code: int) -> Bye:
    """The goodbye of node `sender` to `receiver`, checked field by field. A loss record naming the
    receiver is well-formed (a member that lost node 0 says so) and ignored by it."""
    codes = known_codes(requeue_code)
    code = _int(message, "code")
    if code not in codes:
        raise LinkProtocolError(
            f"node {sender} said goodbye with exit code {code}, not one a supervisor ends with"
        )
    outcome = _text(message, "outcome", 64, "?")
    raw = message.get("lost")
    if raw is None:
        return Bye(code, outcome, None)
    if not isinstance(raw, dict):
        raise LinkProtocolError("a loss record that is not an object")
    node = _int(raw, "node")
    if not 0 <= node < nnodes or node == sender:
        raise LinkProtocolError(f"a loss record of node {node}: not another node of this {nnodes}-node job")
    how = _text(raw, "how", 32)
    if how not in HOWS:
        raise LinkProtocolError(f"a loss record with how={how[:32]!r}, not one of {', '.join(HOWS)}")
    lost_code = raw.get("code")
    if lost_code is not None and (not isinstance(lost_code, int) or lost_code not in codes):
        raise LinkProtocolError(f"a loss record with exit code {str(lost_code)[:40]}")
    host, detail = _text(raw, "host", HOST_LIMIT, ""), _text(raw, "detail", TEXT_LIMIT, "")
    return Bye(code, outcome, LostRecord(node, host, how, detail, lost_code))
