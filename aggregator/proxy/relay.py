"""The other direction (DESIGN §2.6): what upstreams ask of and tell the clients.

Who gets what is the rule of docs/isolation.md:

- On an upstream session a client owns alone (per-client sessions: HTTP/SSE
  upstreams by default, stdio ones with `sessions: per-client`), every request
  and notification of that session belongs to that client, asked on the stream
  of one of its requests in flight (or its own standalone stream).
- On the shared session, a request or log message carrying
  `io.modelcontextprotocol/related-task` belongs to the client that created the
  task; otherwise to the one client whose requests are in flight to that
  upstream. With requests of several clients in flight the owner cannot be told:
  a request is refused (the upstream gets an error, never another client's
  answer) and a log message goes to nobody. Outside any request, the one
  connected client answers only when it is the only client there can be (no
  2026-07-28 client seen); otherwise `roots/list` answers from the upstream's
  configured `roots:` or fails.
- Only what a server may send its client is relayed (sampling, elicitation,
  roots, ping), at most MAX_RELAYED_PER_UPSTREAM in flight per upstream and
  MAX_RELAYED_PER_CLIENT per client; the rest is refused at once.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from aggregator.log import get_logger
from aggregator.proxy.routing import BoundedMap, TaskRouter
from aggregator.sdk import client_connection, request_sender
from aggregator.upstream.pool import UpstreamPool
from aggregator.upstream.session import RELAYABLE_CAPABILITIES, Params, Via

log = get_logger(__name__)

RELAYED_METHODS = frozenset({"sampling/createMessage", "elicitation/create", "roots/list", "ping"})
"""The requests a server may send its client (MCP 2025-11-25); anything else is refused."""
MAX_RELAYED_PER_UPSTREAM = 64
MAX_RELAYED_PER_CLIENT = 32
RELATED_TASK = "io.modelcontextprotocol/related-task"
ELICITATIONS_MAX = 4096
_RELAYED_KEYS = ("roots", "sampling", "elicitation")


@dataclass(frozen=True, slots=True)
class RawOrigin:
    """A raw call's client (`proxy/raw.py`), where the full path has the SDK's request context."""

    connection: Connection
    request_id: Any


class Clients:
    """The connected clients (the SDK's per-client `Connection`), as requests reveal them."""

    def __init__(self) -> None:
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self.modern_seen = False  # a 2026-07-28 client has no lasting connection: once seen, it may be around
        self.on_forget: list[Callable[[Connection], None]] = []  # e.g. the pool ends the client's sessions

    def track(self, ctx: ServerRequestContext[Any, Any]) -> None:
        connection = client_connection(ctx.session)
        if connection is not None and connection not in self._connections:
            if connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
                self.modern_seen = True
            self._connections.add(connection)
            connection.exit_stack.callback(self.forget, connection)  # unwound when the client goes

    def legacy(self) -> list[Connection]:
        """Handshake-era clients: those that can receive notifications and requests on their own stream."""
        return [c for c in list(self._connections) if c.protocol_version not in MODERN_PROTOCOL_VERSIONS]

    def forget(self, connection: Connection) -> None:
        self._connections.discard(connection)
        for listener in list(self.on_forget):
            try:
                listener(connection)
            except Exception as exc:  # a listener's bug must not keep the client's other state alive
                log.warning("client cleanup failed", error=str(exc)[:200])

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
            for key, value in _relayable(caps).items():
                union.setdefault(key, {}).update(value)
        return types.ClientCapabilities.model_validate(union)


def _relayable(caps: types.ClientCapabilities) -> dict[str, Any]:
    """The part of a client's capabilities the aggregator can relay (roots, sampling, elicitation)."""
    dumped = caps.model_dump(by_alias=True, exclude_none=True)
    return {key: dumped[key] for key in _RELAYED_KEYS if key in dumped}


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
        # (upstream, URL elicitation id) → the client asked; bounded, as completions may never come
        self._elicitations: BoundedMap[tuple[str, str], Connection] = BoundedMap(ELICITATIONS_MAX)
        self._relaying: Counter[Any] = Counter()  # relayed requests in flight, by upstream name and by id(client)

    def client_capabilities(self, client: Any = None) -> types.ClientCapabilities:
        if isinstance(client, Connection) and client.client_capabilities is not None:
            return types.ClientCapabilities.model_validate(_relayable(client.client_capabilities))
        return self.clients.capabilities()

    def client_of(self, origin: Any) -> Connection | None:
        """A handshake-era client's connection (a 2026-07-28 client has none that lasts: it shares)."""
        connection = origin_client(origin)
        if connection is None or connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        return connection  # type: ignore[no-any-return]

    async def relay_request(self, upstream: str, method: str, params: Params, via: Via) -> dict[str, Any]:
        if method not in RELAYED_METHODS:
            raise MCPError(types.METHOD_NOT_FOUND, f"{method}: not a request a server may send to its client")
        if method == "ping":  # the aggregator is the upstream's client: it answers for itself
            return {}
        target = self._target(upstream, params, via)
        if isinstance(target, str):  # no client can be told apart: answer what we can, refuse the rest
            roots = self._configured_roots(upstream, method)
            if roots is not None:
                return roots
            hint = " (configure roots: for this upstream)" if method == "roots/list" else ""
            raise MCPError(types.INVALID_REQUEST, f"{method} from {upstream!r}: {target}{hint}")
        connection, send = target
        _require_capability(connection, method, params)
        timeout = self.pool.connection(upstream).config.timeouts.call
        with self._slot(upstream, connection, method):
            result: dict[str, Any] = await send(
                method, dict(params) if params is not None else None, {"timeout": timeout}
            )
        if method == "elicitation/create" and params and isinstance(params.get("elicitationId"), str):
            self._elicitations.put((upstream, params["elicitationId"]), connection)
        return result

    @contextmanager
    def _slot(self, upstream: str, connection: Connection, method: str) -> Iterator[None]:
        """One relayed request in flight, within the bounds per upstream and per client, or a clear refusal."""
        if self._relaying[upstream] >= MAX_RELAYED_PER_UPSTREAM:
            raise MCPError(
                types.INVALID_REQUEST,
                f"{method}: {upstream!r} already has {MAX_RELAYED_PER_UPSTREAM} requests waiting for clients; "
                "retry later",
            )
        if self._relaying[id(connection)] >= MAX_RELAYED_PER_CLIENT:
            raise MCPError(
                types.INVALID_REQUEST,
                f"{method}: the client already has {MAX_RELAYED_PER_CLIENT} requests to answer; retry later",
            )
        self._relaying[upstream] += 1
        self._relaying[id(connection)] += 1
        try:
            yield
        finally:
            for key in (upstream, id(connection)):
                self._relaying[key] -= 1
                if self._relaying[key] <= 0:
                    del self._relaying[key]

    def _target(self, upstream: str, params: Params, via: Via) -> tuple[Connection, Any] | str:
        """The client to ask and the stream to ask it on (one of its requests in flight), or why none can be told."""
        owner = via.client if isinstance(via.client, Connection) else self._task_owner(upstream, params)
        if owner is not None:
            return owner, self._sender(owner, via.origins)
        callers = _callers(via.origins)
        if len(callers) > 1:
            return (
                "requests of several clients are in flight to it on one session; the aggregator cannot tell "
                "which client (sessions: per-client gives each client its own)"
            )
        if callers:
            only = next(iter(callers.values()))
            return only, self._sender(only, via.origins)
        legacy = self.clients.legacy()
        if len(legacy) != 1 or self.clients.modern_seen:
            clients = "2026-07-28 clients" if self.clients.modern_seen else f"{len(legacy)} clients"
            return f"outside a call, with {clients} connected; the aggregator cannot tell which client"
        return legacy[0], legacy[0].send_raw_request

    @staticmethod
    def _sender(connection: Connection, origins: Sequence[Any]) -> Any:
        """The stream of the client's latest request in flight, else its own standalone stream."""
        mine = [o for o in origins if origin_client(o) is connection]
        if mine and isinstance(mine[-1], ServerRequestContext):
            return request_sender(mine[-1].session)
        return connection.send_raw_request  # a raw call's client (a line-based one): its stream is the only one

    def _task_owner(self, upstream: str, params: Params) -> Connection | None:
        """The client that created the task a message names in `_meta` (`related-task`), if it is this upstream's."""
        meta = (params or {}).get("_meta")
        related = meta.get(RELATED_TASK) if isinstance(meta, Mapping) else None
        task_id = related.get("taskId") if isinstance(related, Mapping) else None
        creators = self.tasks.creators(task_id, upstream) if isinstance(task_id, str) else []
        return creators[0] if len(creators) == 1 and isinstance(creators[0], Connection) else None

    def _configured_roots(self, upstream: str, method: str) -> dict[str, Any] | None:
        if method != "roots/list":
            return None
        roots = self.pool.connection(upstream).config.roots
        if not roots:
            return None
        return {"roots": [_root(entry) for entry in roots]}

    async def relay_notification(self, upstream: str, method: str, params: Params, via: Via) -> None:
        params = dict(params or {})
        own = via.client if isinstance(via.client, Connection) else None
        if method == "notifications/message":
            logger = params.get("logger")
            params["logger"] = f"{upstream}/{logger}" if isinstance(logger, str) and logger else upstream
            targets = self._log_targets(upstream, params, via.origins, own)
        elif method == "notifications/resources/updated":
            uri = params.get("uri")
            subscribed = list(self._subscribers.get(uri, ())) if isinstance(uri, str) else []
            if own is not None:  # the client subscribed on its own session
                targets = [own] if own in subscribed else []
            else:
                if isinstance(uri, str):
                    await self.bus.publish(ResourceUpdated(uri=uri))
                targets = subscribed
        elif method == "notifications/tasks/status":
            task_id = params.get("taskId")
            creators = self.tasks.creators(task_id, upstream) if isinstance(task_id, str) else []
            if own is not None:  # on a client's own session: that client's task, if it is one
                targets = [own] if any(c is own for c in creators) else []
            else:  # on the shared session an id names one task: several creators cannot be told apart
                targets = creators if len(creators) == 1 else []
        elif method == "notifications/elicitation/complete":
            target = self._elicitations.get((upstream, str(params.get("elicitationId"))))
            targets = [target] if target is not None and (own is None or target is own) else []
        else:
            return
        for connection in targets:
            if connection.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                await connection.notify(method, params)

    def _log_targets(
        self, upstream: str, params: Mapping[str, Any], origins: Sequence[Any], own: Connection | None
    ) -> list[Connection]:
        """Who hears a log message: its session's or task's client, the one client in flight, or everyone
        when no request is in flight (the upstream's own news); nobody when several clients' requests are."""
        owner = own or self._task_owner(upstream, params)
        if owner is not None:
            return [owner]
        callers = _callers(origins)
        if len(callers) > 1:
            log.debug("log message of an upstream shared by several clients in flight: not relayed", upstream=upstream)
            return []
        if callers:
            return list(callers.values())
        return self.clients.legacy()


def origin_client(origin: Any) -> Connection | None:
    """The client connection of a request in flight: the SDK's request context, or a raw call's origin."""
    if isinstance(origin, RawOrigin):
        return origin.connection
    if isinstance(origin, ServerRequestContext):
        return client_connection(origin.session)  # type: ignore[no-any-return]
    return None


def _callers(origins: Sequence[Any]) -> dict[int, Connection]:
    """The distinct clients of the requests in flight, by identity."""
    return {id(c): c for c in (origin_client(o) for o in origins) if c is not None}


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
