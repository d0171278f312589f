"""The other direction (DESIGN §2.6): what upstreams ask of and tell the clients.

Server→client requests (sampling, elicitation, roots, ping) have no link on the
wire to the call that caused them (stdio carries none), so an upstream's
request goes to the client whose request to *that upstream* is in flight, on
that request's own stream. When requests of several clients are in flight to
it, the target cannot be told: the upstream gets an error, never another
client's answer. Outside any request, the one connected client answers
(stdio); with several, `roots/list` answers from the upstream's configured
`roots:` or fails. Notifications (log messages, resource updates, task status,
URL elicitation completion) go to the clients they concern.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from aggregator.proxy.routing import TaskRouter
from aggregator.sdk import client_connection, request_sender
from aggregator.upstream.pool import UpstreamPool
from aggregator.upstream.session import RELAYABLE_CAPABILITIES


class Clients:
    """The connected clients (the SDK's per-client `Connection`), as requests reveal them."""

    def __init__(self) -> None:
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()

    def track(self, ctx: ServerRequestContext[Any, Any]) -> None:
        connection = getattr(ctx.session, "_connection", None)
        if connection is not None and connection not in self._connections:
            self._connections.add(connection)
            connection.exit_stack.callback(self.forget, connection)  # unwound when the client goes

    def legacy(self) -> list[Connection]:
        """Handshake-era clients: those that can receive notifications and requests on their own stream."""
        return [c for c in list(self._connections) if c.protocol_version not in MODERN_PROTOCOL_VERSIONS]

    def forget(self, connection: Connection) -> None:
        self._connections.discard(connection)

    def capabilities(self) -> types.ClientCapabilities:
        """The union of what the known clients declared; before any is known, all the aggregator can relay.

        A client is known once its capabilities are (its `initialize` committed, or a 2026-07-28
        request envelope declared them); a 2026-07-28 client adds nothing, as it cannot be asked.
        """
        known = [c for c in list(self._connections) if c.client_capabilities is not None]
        if not known:
            return RELAYABLE_CAPABILITIES
        union: dict[str, Any] = {}
        for connection in known:
            caps = connection.client_capabilities
            if caps is None or connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
                continue
            for key in ("roots", "sampling", "elicitation"):
                value = getattr(caps, key)
                if value is not None:
                    merged = union.setdefault(key, {})
                    merged.update(value.model_dump(by_alias=True, exclude_none=True))
        return types.ClientCapabilities.model_validate(union)


class Relay:
    """The pool's `Downstream`: upstream requests and notifications, delivered to the right client."""

    def __init__(
        self,
        pool: UpstreamPool,
        clients: Clients,
        bus: InMemorySubscriptionBus,
        tasks: TaskRouter,
        subscribers: Mapping[str, weakref.WeakSet[Connection]],
    ) -> None:
        self.pool = pool
        self.clients = clients
        self.bus = bus
        self.tasks = tasks
        self._subscribers = subscribers  # resource URI → the clients subscribed to it (kept by the pass-through)
        self._elicitations: dict[str, Connection] = {}  # URL elicitation id → the client asked

    def client_capabilities(self) -> types.ClientCapabilities:
        return self.clients.capabilities()

    async def relay_request(
        self, upstream: str, method: str, params: Mapping[str, Any] | None, origins: Sequence[Any]
    ) -> dict[str, Any]:
        target = self._target(origins)
        if isinstance(target, str):  # no client can be told apart: answer what we can, refuse the rest
            if method == "ping":
                return {}
            roots = self._configured_roots(upstream, method)
            if roots is not None:
                return roots
            hint = " (configure roots: for this upstream)" if method == "roots/list" else ""
            raise MCPError(types.INVALID_REQUEST, f"{method} from {upstream!r}: {target}{hint}")
        connection, send = target
        _require_capability(connection, method, params)
        timeout = self.pool.connection(upstream).config.timeouts.call
        result: dict[str, Any] = await send(method, dict(params) if params is not None else None, {"timeout": timeout})
        if method == "elicitation/create" and params and isinstance(params.get("elicitationId"), str):
            self._elicitations[params["elicitationId"]] = connection
        return result

    def _target(self, origins: Sequence[Any]) -> tuple[Connection, Any] | str:
        """The client to ask and the stream to ask it on (its in-flight request's own), or why none can be told."""
        callers = [
            o for o in origins if isinstance(o, ServerRequestContext) and client_connection(o.session) is not None
        ]
        clients = {id(client_connection(caller.session)) for caller in callers}
        if len(clients) > 1:
            return "requests of several clients are in flight to it; the aggregator cannot tell which client"
        if callers:
            session = callers[-1].session
            return client_connection(session), request_sender(session)
        legacy = self.clients.legacy()
        if len(legacy) != 1:
            return f"outside a call, with {len(legacy)} clients connected; the aggregator cannot tell which client"
        return legacy[0], legacy[0].send_raw_request

    def _configured_roots(self, upstream: str, method: str) -> dict[str, Any] | None:
        if method != "roots/list":
            return None
        roots = self.pool.connection(upstream).config.roots
        if not roots:
            return None
        return {"roots": [_root(entry) for entry in roots]}

    async def relay_notification(self, upstream: str, method: str, params: Mapping[str, Any] | None) -> None:
        params = dict(params or {})
        if method == "notifications/message":
            logger = params.get("logger")
            params["logger"] = f"{upstream}/{logger}" if isinstance(logger, str) and logger else upstream
            targets = self.clients.legacy()
        elif method == "notifications/resources/updated":
            uri = params.get("uri")
            if isinstance(uri, str):
                await self.bus.publish(ResourceUpdated(uri=uri))
            targets = list(self._subscribers.get(uri, ())) if isinstance(uri, str) else []
        elif method == "notifications/tasks/status":
            task_id = params.get("taskId")
            owner = self.tasks.owner(task_id) if isinstance(task_id, str) else None
            targets = [owner[1]] if owner is not None and owner[1] is not None else []
        elif method == "notifications/elicitation/complete":
            target = self._elicitations.pop(str(params.get("elicitationId")), None)
            targets = [target] if target is not None else []
        else:
            return
        for connection in targets:
            if connection.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                await connection.notify(method, params)


_REQUIRED = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}


def _require_capability(connection: Connection, method: str, params: Mapping[str, Any] | None) -> None:
    """A clear JSON-RPC error for the upstream when the client cannot answer `method`."""
    if connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
        raise MCPError(
            types.INVALID_REQUEST,
            f"{method}: the client speaks {connection.protocol_version}, which has no server-to-client requests",
        )
    needed = _REQUIRED.get(method)
    if needed is None:
        return
    caps = connection.client_capabilities
    declared = getattr(caps, needed, None) if caps is not None else None
    if needed == "elicitation" and declared is not None:
        mode = (params or {}).get("mode") or "form"
        modes = declared.model_dump(exclude_none=True)
        if (mode not in modes) if modes else (mode != "form"):  # an empty object means form only (spec)
            declared = None
    if declared is None:
        raise MCPError(
            types.INVALID_REQUEST, f"{method}: the client connected to the aggregator did not declare {needed}"
        )


def _root(entry: str) -> dict[str, Any]:
    """A configured root (a directory or a URI) as a `roots/list` entry."""
    uri = entry if "://" in entry else Path(entry).expanduser().absolute().as_uri()
    return {"uri": uri, "name": entry.rstrip("/").rsplit("/", 1)[-1] or entry}
