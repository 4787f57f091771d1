"""How a peer node of a multi-node job was lost, and what a surviving node exits with because of it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from truestep.core.errors import ExitCode, Outcome


@dataclass
class NodeLoss:
    node: int
    host: str
    how: str
    """closed (connection ended without a goodbye), silent (no beat for node_timeout_s), left (goodbye
    with an exit code), never_joined, unreachable (node 0 could not be reached), rejected."""
    detail: str
    at: float = field(default_factory=time.time)
    """Wall clock when this supervisor learned of it."""
    code: int | None = None
    """The exit code the node left with (how == left)."""
    via: int | None = None
    """The node that reported it, when it was not seen directly (the hub passes losses on)."""

    def exit_code(self, requeue_code: int = ExitCode.REQUEUE) -> int:
        """What a survivor exits with: the code a departed node ended with when that says what to do
        (a refusal, a fence or a refusing filesystem a requeue cannot fix, an interrupt, a preemption
        with the job's `requeue_code`), else 77: requeue me."""
        if self.code is None:
            return ExitCode.NODE_LOST
        outcome = Outcome.of(self.code, requeue_code)
        follow = not outcome.retryable or outcome in (Outcome.REQUEUE, Outcome.INTERRUPTED)
        return self.code if follow else ExitCode.NODE_LOST

    def describe(self) -> str:
        via = f" (reported by node {self.via})" if self.via is not None else ""
        what = self.detail if self.how == "left" else f"lost: {self.how}: {self.detail}"
        return f"node {self.node} ({self.host or 'unknown host'}) {what}{via}"

    def to_event(self) -> dict[str, Any]:
        return {
            "lost_node": self.node,
            "lost_host": self.host,
            "how": self.how,
            "detail": self.detail,
            "lost_exit_code": self.code,
            "reported_by": self.via,
        }
