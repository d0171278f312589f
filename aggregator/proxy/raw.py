"""The raw path of a client's `tools/call`: answered without the SDK's server runner.

A proxied call through the SDK crosses its server runner (a context, middleware, params
validated into a model, the result dumped and sieved, a response model encoded) and its
client session. On a line-based client (stdio, or a service client over the Unix socket),
a `tools/call` to a direct tool or `catalog_call_tool` is taken here instead, after
`parse_client_line` has checked the envelope: the same handler code runs
(`AggregatorServer.call_tool_for`, so lazy start, name resolution, faults, secrets masking and
`on_call_result` are those of the full path), its result is sieved exactly as the SDK sieves
it (`serialize_server_result`) and written to the client as bytes with the client's own id.
Upstream, the request goes as bytes too (`upstream/raw_calls.py`) unless that upstream says
`call_path: full`.

A call falls back to the full path, with a debug line `raw path not taken` naming the rule,
when: the client has not finished its handshake or speaks 2026-07-28 (`era`); the params are
not what the SDK's validation surely accepts (`params`); the call is task-augmented (`task`);
the tool is none of the above (`tool`); the target upstream says `call_path: full`
(`call_path`); or the client reuses an id still in flight (`duplicate_id`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import mcp.types as types
import pydantic_core
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.connection import Connection
from mcp_types.jsonrpc import CONNECTION_CLOSED
from mcp_types.methods import serialize_server_result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from aggregator.log import get_logger
from aggregator.proxy.passthrough import for_era, forwarded_meta
from aggregator.proxy.relay import RawOrigin
from aggregator.tools.base import ToolContext, invalid_result

if TYPE_CHECKING:
    from aggregator.proxy.server import AggregatorServer

log = get_logger(__name__)

CATALOG_CALL = "catalog_call_tool"
SHUTDOWN_WRITE_SECONDS = 2.0  # as the SDK bounds its own answers at shutdown
_PLAIN_KEYS = frozenset({"name", "arguments", "_meta", "task"})  # any other key: the SDK validates it

Done = Callable[[Any], None]
"""Told when a raw call's answer is on its way to the client (or none is due): its in-flight slot is free."""


class RawRouter:
    """The server's side of the raw path: which calls may take it, and running them."""

    def __init__(self, server: AggregatorServer) -> None:
        self.server = server
        self.taken = 0  # calls answered on the raw path (tests read it)
        self.fallbacks: dict[str, int] = {}  # rule → calls that fell back to the full path

    def lane(self, replies: MemoryObjectSendStream[Any], done: Done) -> RawLane:
        """The raw calls of one client, answered on `replies` (the client's writer takes bytes)."""
        return RawLane(self, replies, done)

    def fallback(self, rule: str, request_id: Any) -> None:
        self.fallbacks[rule] = self.fallbacks.get(rule, 0) + 1
        log.debug("raw path not taken", rule=rule, id=request_id)

    def route(self, params: Mapping[str, Any]) -> str | None:
        """Why a well-formed `tools/call` must take the full path (a rule's name), or None."""
        name = params["name"]
        if name == CATALOG_CALL:
            arguments = params.get("arguments") or {}
            server = arguments.get("server")
            upstream = self.server.pool.resolve(server) if isinstance(server, str) else None
        elif name in self.server.own_tool_names:
            return "tool"
        else:
            direct = self.server.direct_tool_now(name)
            upstream = direct.server if direct is not None else None
        if upstream is None:
            return "tool"
        if self.server.pool.config.upstreams[upstream].call_path != "raw":
            return "call_path"
        return None


class RawLane:
    """One client's raw calls: started from its reader, cancelled by its `notifications/cancelled`."""

    def __init__(self, router: RawRouter, replies: MemoryObjectSendStream[Any], done: Done) -> None:
        self.router = router
        self._replies = replies
        self._done = done
        self.connection: Connection | None = None  # learnt from the first request the SDK handles
        self._calls: dict[Any, anyio.CancelScope] = {}

    def bind(self, connection: Connection) -> None:
        if self.connection is None:
            self.connection = connection

    def accepts(self, message: types.JSONRPCRequest) -> bool:
        """Whether this request takes the raw path (else the SDK's runner gets it)."""
        if message.method != "tools/call":
            return False
        rule = self._rule(message)
        if rule is not None:
            self.router.fallback(rule, message.id)
            return False
        return True

    def _rule(self, message: types.JSONRPCRequest) -> str | None:
        connection = self.connection
        if (
            connection is None
            or not connection.initialize_accepted
            or connection.protocol_version in MODERN_PROTOCOL_VERSIONS
        ):
            return "era"
        params = message.params
        if not _plain_call_params(params):
            return "params"
        assert params is not None
        if "task" in params:
            return "task"
        if message.id in self._calls:
            return "duplicate_id"
        return self.router.route(params)

    def start(self, message: types.JSONRPCRequest, task_group: anyio.abc.TaskGroup) -> None:
        scope = self._calls[message.id] = anyio.CancelScope()
        task_group.start_soon(self._run, message, scope)

    def cancel(self, params: Mapping[str, Any] | None) -> bool:
        """A client's `notifications/cancelled` for one of our calls: cancel it (no answer is due)."""
        request_id = params.get("requestId") if params else None
        scope = self._calls.get(request_id) if isinstance(request_id, str | int) else None
        if scope is None:
            return False
        scope.cancel()
        return True

    async def _run(self, message: types.JSONRPCRequest, scope: anyio.CancelScope) -> None:
        """One call; its answer written unless the client cancelled it (or the session ended)."""
        try:
            line: bytes | None = None
            with scope:
                line = await self._call(message)
            if line is not None:
                with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await self._replies.send(line)
        except anyio.get_cancelled_exc_class():
            if line is None:  # the session is ending: answered as the SDK answers its own requests then
                await self._answer_at_shutdown(message.id)
            raise
        finally:
            del self._calls[message.id]
            self._done(message.id)

    async def _answer_at_shutdown(self, request_id: Any) -> None:
        line = _error_line(request_id, CONNECTION_CLOSED, "Connection closed")
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(SHUTDOWN_WRITE_SECONDS),
            suppress(anyio.BrokenResourceError, anyio.ClosedResourceError),
        ):
            await self._replies.send(line)

    async def _call(self, message: types.JSONRPCRequest) -> bytes:
        assert self.connection is not None and message.params is not None
        params = message.params
        version = self.connection.protocol_version or ""
        ctx = ToolContext(
            report_progress=self._progress(message.params),
            extra=forwarded_meta(params),
            origin=RawOrigin(self.connection, message.id),
        )
        result = await self.router.server.call_tool_for(params["name"], params.get("arguments") or {}, ctx, None)
        self.router.taken += 1
        return _result_line(message.id, result, version)

    def _progress(self, params: Mapping[str, Any]) -> Any:
        """The client's progress token, reported to as the SDK's `report_progress` does (never blocking)."""
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, Mapping) else None
        if token is None:
            return _no_progress
        replies = self._replies

        async def report(progress: float, total: float | None, message: str | None) -> None:
            body: dict[str, Any] = {"progressToken": token, "progress": progress}
            if total is not None:
                body["total"] = total
            if message is not None:
                body["message"] = message
            try:  # from the upstream's reader: never wait on a client that does not read
                replies.send_nowait(_line({"jsonrpc": "2.0", "method": "notifications/progress", "params": body}))
            except anyio.WouldBlock:
                log.debug("progress not relayed: the client's writer is full", token=token)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

        return report


async def _no_progress(progress: float, total: float | None, message: str | None) -> None:
    return None


def _plain_call_params(params: Any) -> bool:
    """Params the SDK's `tools/call` validation accepts for sure; anything unusual takes the full path,
    so that it gets the SDK's own answer."""
    if not isinstance(params, dict) or not isinstance(params.get("name"), str) or not params.keys() <= _PLAIN_KEYS:
        return False
    arguments = params.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        return False
    meta = params.get("_meta")
    if meta is None:
        return "_meta" not in params
    if not isinstance(meta, dict):
        return False
    token = meta.get("progressToken")
    return "progressToken" not in meta or (isinstance(token, str | int) and not isinstance(token, bool))


def _result_line(request_id: Any, result: Any, version: str) -> bytes:
    """The answer as the full path writes it: `_call_result`'s check, then the SDK runner's dump and
    sieve for the client's version (one validation does both), in a response with the client's id."""
    result = for_era(result, version)
    try:
        dumped = serialize_server_result("tools/call", version, _dumped(result))
    except ValidationError as exc:  # the full path's `_call_result` turns it into a fault result
        dumped = serialize_server_result("tools/call", version, _dumped(invalid_result(exc)))
    try:
        return _line({"jsonrpc": "2.0", "id": request_id, "result": dumped})
    except (ValueError, TypeError) as exc:
        log.warning("a message could not be serialised", kind="JSONRPCResponse", error=str(exc)[:200])
        return _error_line(request_id, types.INTERNAL_ERROR, "the answer could not be serialised as JSON")


def _dumped(result: Any) -> dict[str, Any]:
    if isinstance(result, BaseModel):
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dict(result)


def _error_line(request_id: Any, code: int, message: str) -> bytes:
    return _line({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})


def _line(message: Any) -> bytes:
    return pydantic_core.to_json(message) + b"\n"
