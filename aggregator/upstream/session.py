"""The client session the aggregator holds with one upstream, and what it relays upward.

The SDK's `ClientSession` declares capabilities from which callbacks were
passed, answers server→client requests through typed callbacks, and drops
notifications it has no model for (`notifications/tasks/status`). A proxy needs
the opposite: declare what *its* clients declared, and hand every
server→client request and every notification on, raw, to whoever fronts the
clients. `Downstream` is that someone, seen from below: the pool holds one, the
server installs the real one, so nothing here imports anything higher.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mcp.types as types
from mcp import ClientSession
from mcp.shared.dispatcher import DispatchContext
from mcp.shared.exceptions import MCPError
from mcp.shared.transport_context import TransportContext

RELAYED_NOTIFICATIONS = frozenset(
    {
        "notifications/message",
        "notifications/resources/updated",
        "notifications/tasks/status",
        "notifications/elicitation/complete",
    }
)
"""Upstream notifications handed on to clients. list_changed is not among them: the
catalog is re-listed first and the server announces the change it actually sees."""

RELAYABLE_CAPABILITIES = types.ClientCapabilities(
    roots=types.RootsCapability(list_changed=True),
    sampling=types.SamplingCapability(),
    elicitation=types.ElicitationCapability(
        form=types.FormElicitationCapability(), url=types.UrlElicitationCapability()
    ),
)
"""What the aggregator can relay: declared to an upstream started before any client is known."""


Params = Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class Via:
    """The upstream session a request or notification came on, as the relay needs it.

    `client`: the downstream client that owns the session alone (an opaque handle from
    `Downstream.client_of`), or None for the session all clients share; `origins`: the
    client requests in flight on that session.
    """

    origins: Sequence[Any] = ()
    client: Any = None


def offered_names(capabilities: types.ClientCapabilities) -> tuple[str, ...]:
    """The relayable capabilities declared in `capabilities`, by name, sorted (what a catalog was listed under)."""
    return tuple(name for name in ("elicitation", "roots", "sampling") if getattr(capabilities, name) is not None)


class Downstream(Protocol):
    """The aggregator's clients, as an upstream connection sees them."""

    def client_capabilities(self, client: Any = None) -> types.ClientCapabilities:
        """What to declare to an upstream session that starts now (for `client` alone, or for all)."""
        ...

    def client_of(self, origin: Any) -> Any:
        """The client a request in flight came from, when it can have a session of its own (else None)."""
        ...

    async def relay_request(self, upstream: str, method: str, params: Params, via: Via) -> dict[str, Any]:
        """Answer a server→client request of `upstream`. Raises `MCPError` for the upstream to receive."""
        ...

    async def relay_notification(self, upstream: str, method: str, params: Params, via: Via) -> None: ...


class NoDownstream:
    """Before a server is attached (the CLI's `list-upstreams`, `search`): declare nothing, relay nothing."""

    def client_capabilities(self, client: Any = None) -> types.ClientCapabilities:
        return types.ClientCapabilities()

    def client_of(self, origin: Any) -> Any:
        return None

    async def relay_request(self, upstream: str, method: str, params: Params, via: Via) -> dict[str, Any]:
        if method == "ping":
            return {}
        raise MCPError(code=types.METHOD_NOT_FOUND, message=f"no client is connected to answer {method}")

    async def relay_notification(self, upstream: str, method: str, params: Params, via: Via) -> None:
        return None


class UpstreamSession(ClientSession):
    """A `ClientSession` that declares borrowed capabilities and relays the server's requests raw."""

    def __init__(
        self,
        *args: Any,
        capabilities: Callable[[], types.ClientCapabilities],
        on_request: Callable[[str, Mapping[str, Any] | None], Any],
        on_notification: Callable[[str, Mapping[str, Any] | None], Any],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._declared = capabilities
        self._relay_request = on_request
        self._relay_notification = on_notification

    def _build_capabilities(self, version: str) -> types.ClientCapabilities:
        return self._declared()

    async def _on_request(
        self, dctx: DispatchContext[TransportContext], method: str, params: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        result: dict[str, Any] = await self._relay_request(method, params)
        return result

    async def _on_notify(
        self, dctx: DispatchContext[TransportContext], method: str, params: Mapping[str, Any] | None
    ) -> None:
        if method in RELAYED_NOTIFICATIONS:
            await self._relay_notification(method, params)
        await super()._on_notify(dctx, method, params)
