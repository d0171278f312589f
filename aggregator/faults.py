"""The fault taxonomy of the catalog tools (DESIGN §2.1).

A *programmer* fault means the caller must change the call; a *world* fault means
retrying later may work. Raise `Fault` anywhere below the tool layer; the tool
layer turns it into a `CallToolResult` with `isError: true`.
"""

from __future__ import annotations

from typing import Literal

from aggregator.log import redact_text

FaultKind = Literal["programmer", "world"]

PROGRAMMER_REASONS = frozenset({"invalid_argument", "unknown_server", "unknown_tool"})
WORLD_REASONS = frozenset(
    {"upstream_unavailable", "upstream_error", "timeout", "response_too_large", "result_too_large"}
)


class Fault(Exception):
    """A fault with a reason code from DESIGN §2.1 and a one-line message."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in PROGRAMMER_REASONS and reason not in WORLD_REASONS:
            raise ValueError(f"unknown fault reason {reason!r}")
        message = redact_text(message)  # it reaches the client: no configured secret in it
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def kind(self) -> FaultKind:
        return "programmer" if self.reason in PROGRAMMER_REASONS else "world"

    def to_dict(self) -> dict[str, object]:
        return {"error": {"kind": self.kind, "reason": self.reason, "message": self.message}}


class SignInNeeded(Fault):
    """`upstream_unavailable` because `upstream` needs an OAuth sign-in: the server may offer the sign-in
    link to a client that can open one (URL-mode elicitation) instead of answering with the message."""

    def __init__(self, upstream: str, message: str) -> None:
        super().__init__("upstream_unavailable", message)
        self.upstream = upstream


def invalid_argument(message: str) -> Fault:
    return Fault("invalid_argument", message)
