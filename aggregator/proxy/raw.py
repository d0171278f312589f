"""The raw path of a client's request to one upstream: answered without the SDK's server runner.

A proxied call through the SDK crosses its server runner (a context, middleware, params
validated into a model, the result dumped and sieved, a response model encoded) and its
client session. On a line-based client (stdio, or a service client over the Unix socket),
a `tools/call` to a direct tool or `catalog_call_tool`, a `prompts/get`, a `resources/read` or
a `completion/complete` is taken here instead, after `parse_client_line` has checked the
envelope and the SDK's own validator the params (a plain `tools/call`'s are checked in JSON
terms, `raw_checks.py`): the same handler code runs
(`AggregatorServer.call_tool_for`, `Passthrough.*_for`: lazy start, name resolution, faults,
secrets masking and `on_call_result` are those of the full path), its result is sieved exactly
as the SDK's runner sieves it and written to the client as bytes with the client's own id. A
tools/call whose upstream runs and lists the tool skips those handler layers: a route found by the
lane's rules (`RawRouter.route_of`, `upstream/pool.py` `ToolRoute`) takes it straight to the
upstream's raw leg, with the same bookkeeping around the request.
Upstream, the request goes as bytes too (`upstream/raw_calls.py`) unless that upstream says
`call_path: full`.

A request falls back to the full path, with a debug line `raw path not taken` naming the rule,
when: the client has not finished its handshake or speaks 2026-07-28 (`era`); the SDK's
validator refuses the params (`params`: the SDK answers them); the request is task-augmented
(`task`); its target is not known without starting anything, or is one of our own tools
(`target`); the target upstream says `call_path: full` (`call_path`); or the client reuses an
id still in flight (`duplicate_id`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc
import mcp.types as types
from mcp.server.caching import CacheHint
from mcp.server.connection import Connection
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.jsonrpc import CONNECTION_CLOSED
from mcp_types.methods import is_input_required, serialize_server_result, validate_client_request
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from aggregator.faults import Fault
from aggregator.log import get_logger
from aggregator.proxy.passthrough import forwarded_meta
from aggregator.proxy.raw_checks import plain_text_result, tools_call_params_ok
from aggregator.proxy.relay import RawOrigin
from aggregator.tools.base import ToolContext, fault_result, internal_error_result, invalid_result
from aggregator.tools.catalog import CATALOG_CALL
from aggregator.wire import encode, error_line, json_line

if TYPE_CHECKING:
    from aggregator.proxy.exposure import DirectTool
    from aggregator.proxy.server import AggregatorServer
    from aggregator.upstream.pool import ToolRoute

log = get_logger(__name__)

RAW_METHODS = frozenset({"tools/call", "prompts/get", "resources/read", "completion/complete"})
SHUTDOWN_WRITE_SECONDS = 2.0  # as the SDK bounds its own answers at shutdown
INVALID_RESULT = "Handler returned an invalid result"  # the SDK runner's words


class Replies(Protocol):
    """Where a lane writes: its client's outbox."""

    async def send(self, line: bytes) -> None: ...

    def send_nowait(self, line: bytes) -> None: ...


class Request(Protocol):
    """A client's request as a lane reads it: the request model, or `downstream.client_messages.PlainRequest`
    (the fields of a line the read callback starts at once, no model built)."""

    @property
    def id(self) -> str | int: ...

    @property
    def method(self) -> str: ...

    @property
    def params(self) -> dict[str, Any] | None: ...


Done = Callable[[Any], None]
"""Told when a raw call's answer is on its way to the client (or none is due): its in-flight slot is free."""


class RawRouter:
    """The server's side of the raw path: which calls may take it, and running them."""

    def __init__(self, server: AggregatorServer) -> None:
        self.server = server
        self.taken = 0  # calls answered on the raw path (tests read it)
        self.fallbacks: dict[str, int] = {}  # rule → calls that fell back to the full path
        self.routed = 0  # of those, tools/call that went by a route straight to the upstream's raw leg (tests read it)
        self.stale_routes = 0  # tools/call let in with a route that went stale before it ran: the layers took it
        # a tools/call's name (catalog_call_tool's (upstream, tool)) → its route and the direct tool it was made for
        self._routes: dict[Any, tuple[ToolRoute, DirectTool | None]] = {}
        server.pool.store.subscribe(lambda _server, _catalog: self._routes.clear())
        server.pool.on_reconfigure(lambda _diff: self._routes.clear())

    def lane(self, replies: Replies, done: Done) -> RawLane:
        """The raw calls of one client, answered through `replies` (`downstream/stdio.py`'s `Outbox`)."""
        return RawLane(self, replies, done)

    def fallback(self, rule: str, request_id: Any, method: str) -> None:
        self.fallbacks[rule] = self.fallbacks.get(rule, 0) + 1
        log.debug("raw path not taken", rule=rule, id=request_id, method=method)

    def route(self, method: str, params: Mapping[str, Any]) -> str | None:
        """Why a valid request must take the full path (a rule's name), or None."""
        upstream = self._target(method, params)
        config = self.server.pool.config.upstreams.get(upstream) if upstream is not None else None
        if config is None:  # unknown, or gone with a config reload
            return "target"
        if config.call_path != "raw":
            return "call_path"
        return None

    def _target(self, method: str, params: Mapping[str, Any]) -> str | None:
        """The upstream a request goes to, as known now (None: not known without starting anything)."""
        passthrough = self.server.passthrough
        if method == "prompts/get":
            return passthrough.prompt_owner(params["name"])
        if method == "resources/read":
            return passthrough.resources.resolve(str(params["uri"]))
        if method == "completion/complete":
            return passthrough.completion_owner(params)
        name = params["name"]
        if name == CATALOG_CALL:
            server = (params.get("arguments") or {}).get("server")
            return self.server.pool.resolve(server) if isinstance(server, str) else None
        if name in self.server.own_tool_names:
            return None
        direct = self.server.direct_tool_now(name)
        return direct.server if direct is not None else None

    def route_of(self, params: Mapping[str, Any]) -> tuple[ToolRoute, Mapping[str, Any]] | None:
        """A `tools/call`'s route straight to its upstream's raw leg, and the arguments to send; None: the
        handler layers answer it (`answer`), e.g. a tool not listed by a running upstream, bad arguments.

        Routes are kept per name (catalog_call_tool: per upstream and tool), dropped when a
        catalog or the config changes, and checked on each use (`ToolRoute.current`, and for a direct
        tool that the exposure table still maps the name to the same tool)."""
        name, arguments = params["name"], params.get("arguments")
        key: Any
        if name == CATALOG_CALL:
            if type(arguments) is not dict:
                return None
            server, tool, arguments = arguments.get("server"), arguments.get("tool"), arguments.get("arguments", {})
            upstream = self.server.pool.resolve(server) if type(server) is str else None
            if upstream is None or type(tool) is not str:
                return None
            key, arguments = (upstream, tool), {} if arguments is None else arguments  # never more keys than tools
            if type(arguments) is not dict:
                return None  # `CatalogTools.call_tool` answers it (invalid_argument)
        elif name in self.server.own_tool_names:
            return None
        else:
            key, arguments = name, arguments or {}
        known = self._routes.get(key)
        if (
            known is None
            or not known[0].current()
            or (known[1] is not None and self.server.direct_tool_now(name) is not known[1])
        ):
            known = self._new_route(key)
            if known is None:
                return None
        return known[0], arguments

    def _new_route(self, key: Any) -> tuple[ToolRoute, DirectTool | None] | None:
        pool = self.server.pool
        if isinstance(key, tuple):
            route, direct = pool.tool_route(*key), None
        else:
            direct = self.server.direct_tool_now(key)
            route = pool.tool_route(direct.server, direct.tool) if direct is not None else None
        if route is None:
            self._routes.pop(key, None)
            return None
        self._routes[key] = known = (route, direct)
        return known

    async def answer(self, method: str, params: Mapping[str, Any], caller: ToolContext, version: str) -> Any:
        """What the full path's handler for `method` returns (an `MCPError` raised as it would be)."""
        passthrough = self.server.passthrough
        if method == "tools/call":
            return await self.server.call_tool_for(params["name"], params.get("arguments") or {}, caller, None)
        if method == "prompts/get":
            return await passthrough.get_prompt_for(params, caller, version)
        if method == "resources/read":
            return await passthrough.read_resource_for(params, caller, version)
        return await passthrough.complete_for(params, caller, version)


class RawLane:
    """One client's raw calls: started from its reader, cancelled by its `notifications/cancelled`."""

    def __init__(self, router: RawRouter, replies: Replies, done: Done) -> None:
        self.router = router
        self._replies = replies
        self._done = done
        self.connection: Connection | None = None  # learnt from the first request the SDK handles
        self._calls: dict[Any, asyncio.Task[None]] = {}
        self._settled: set[Any] = set()  # calls cancelled by their client, or whose answer is being written
        self._running: set[Any] = set()  # calls whose task has started (only those are cancelled as tasks)
        self._supervised = self._closing = False
        self._routed: dict[Any, tuple[ToolRoute, Mapping[str, Any]]] = {}  # id → the route `_rule` found for it
        self._refused: tuple[Any, str] | None = None  # the id of the request `takes` refused last, and why
        # "<method>" → calls taken, "route" → tools/call of those by a route, "<method>:<rule>" → left to the full path
        self.counts: dict[str, int] = {}

    def bind(self, connection: Connection) -> None:
        if self.connection is None:
            self.connection = connection

    def accepts(self, message: Request, *, duplicate: bool = False) -> bool:
        """Whether this request takes the raw path (else the SDK's runner gets it).

        `duplicate`: the client's id is that of a request still in flight (on either path).
        """
        if message.method not in RAW_METHODS:
            return False
        refused, self._refused = self._refused, None
        try:
            if duplicate:
                rule: str | None = "duplicate_id"
            elif refused is not None and refused[0] == message.id:  # `takes` has just judged this request
                rule = refused[1]
            else:
                rule = self._rule(message)
        except Exception as exc:  # a bug here must not end the client's session: the full path answers
            log.warning("raw path check failed", error=f"{type(exc).__name__}: {exc}"[:300])
            rule = "error"
        if rule is not None:
            self.router.fallback(rule, message.id, message.method)
            self._count(f"{message.method}:{rule}")
            return False
        return True

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def takes(self, message: Request) -> bool:
        """`accepts` for a request whose id is not in flight, without counting or logging a refusal
        (the read callback asks first; what it leaves goes through `accepts`, which reuses the rule found
        here). Not before the lane's first call has started its supervisor in the session's task group,
        from a task."""
        if message.method not in RAW_METHODS or not self._supervised:
            return False
        try:
            rule = self._rule(message)
        except Exception:
            return False
        if rule is not None:
            self._refused = (message.id, rule)  # for `accepts`, which gets this request next (as a model)
        return rule is None

    def _rule(self, message: Request) -> str | None:
        connection = self.connection
        if (
            connection is None
            or not connection.initialize_accepted
            or connection.protocol_version in MODERN_PROTOCOL_VERSIONS
        ):
            return "era"
        params = message.params
        if not (message.method == "tools/call" and tools_call_params_ok(params)) and not self._params_valid(
            message.method, connection.protocol_version, params
        ):
            return "params"
        assert params is not None  # the four methods require params
        if "task" in params:
            return "task"
        if message.method == "tools/call" and (routed := self.router.route_of(params)) is not None:
            self._routed[message.id] = routed  # a route implies the target's rules: the call takes it
            return None
        return self.router.route(message.method, params)

    def _params_valid(self, method: str, version: str, params: Mapping[str, Any] | None) -> bool:
        """As the SDK's runner checks them: the version's surface, then the handler's params model
        (stricter in places: a null `progressToken` passes the first, not the second)."""
        entry = self.router.server.lowlevel.get_request_handler(method)
        try:
            validate_client_request(method, version, params)
            if entry is not None:
                entry.params_type.model_validate({} if params is None else params, by_name=False)
        except (ValidationError, ValueError, KeyError):
            return False
        return True

    def start(self, message: Request, task_group: anyio.abc.TaskGroup) -> None:
        """Run the call in an asyncio task of its own: a fifth of anyio's cost to start one (the server
        runs on asyncio). `_supervise`, in `task_group`, cancels the calls when the session ends."""
        if not self._supervised:
            self._supervised = True
            task_group.start_soon(self._supervise)
        self._calls[message.id] = asyncio.get_running_loop().create_task(self._run(message))

    def cancel(self, params: Mapping[str, Any] | None) -> bool:
        """A client's `notifications/cancelled` for one of our calls: cancel it (no answer is due).

        A call whose answer is already being written is not stopped (a line cut short would break
        the client's stream): the answer goes out, as the full path's would.
        """
        request_id = params.get("requestId") if params else None
        if not isinstance(request_id, str | int) or request_id not in self._calls:
            return False
        if request_id not in self._settled:
            self._settled.add(request_id)
            if request_id in self._running:  # else `_run` sees it settled when it starts
                self._calls[request_id].cancel()
        return True

    async def _supervise(self) -> None:
        """Wait for the session's end; then cancel the calls still running and let them answer."""
        try:
            await anyio.sleep_forever()
        finally:
            # what this client's requests did, for a look from outside (`tests/test_conformance.py`'s chain)
            log.info("raw lane closed", counts=" ".join(f"{key}={n}" for key, n in sorted(self.counts.items())))
            self._closing = True  # a call not started yet answers as soon as it starts
            for request_id in self._running:
                self._calls[request_id].cancel()
            if self._calls:
                with anyio.CancelScope(shield=True), anyio.move_on_after(2 * SHUTDOWN_WRITE_SECONDS):
                    await asyncio.wait(list(self._calls.values()))

    async def _run(self, message: Request) -> None:
        """One call; its answer written unless the client cancelled it (or the session ended).

        A task cancelled before its first step would never run this body (nor its `finally`), so a
        call is cancelled as a task only once it runs; before, it is marked and stops here.
        """
        request_id, line = message.id, None
        self._running.add(request_id)
        try:
            if request_id in self._settled:  # cancelled by its client before it started
                return
            if self._closing:
                raise asyncio.CancelledError  # the session ended before it started: answered below
            line = await self._call(message)
            if request_id in self._settled:  # the client cancelled it as it finished: no answer
                return
            self._settled.add(request_id)  # from here on the answer is written whole
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await self._replies.send(line)
        except asyncio.CancelledError:  # the task ends here: cancelled by its client, or the session is ending
            if line is None and request_id not in self._settled:
                await self._answer_at_shutdown(request_id)  # as the SDK answers its own requests then
        except Exception as exc:  # nothing else is raised here; were it, the client's slot must still be freed
            log.error("raw call failed", error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            self._routed.pop(request_id, None)  # a call cancelled before it ran never took its route
            del self._calls[request_id]
            self._settled.discard(request_id)
            self._running.discard(request_id)
            self._done(request_id)

    async def _answer_at_shutdown(self, request_id: Any) -> None:
        line = error_line(request_id, CONNECTION_CLOSED, "Connection closed")
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(SHUTDOWN_WRITE_SECONDS),
            suppress(anyio.BrokenResourceError, anyio.ClosedResourceError),
        ):
            await self._replies.send(line)

    async def _call(self, message: Request) -> bytes:
        assert self.connection is not None and message.params is not None
        params, method, request_id = message.params, message.method, message.id
        version = self.connection.protocol_version
        router = self.router
        router.taken += 1
        self._count(method)
        origin = RawOrigin(self.connection, request_id)
        # The route `_rule` found when it let the call in, a loop turn ago: a reload, a new listing or a
        # death noticed in that turn sends the call to the layers, which look the upstream up again.
        routed = self._routed.pop(request_id, None)
        if routed is not None and not routed[0].current():
            routed, router.stale_routes = None, router.stale_routes + 1
        try:
            if routed is None:
                progress, extra = self._progress(params), forwarded_meta(params)
                result = await router.answer(method, params, ToolContext(progress, extra, origin), version)
            else:  # what `call_tool_for` gives for it, without the layers between (a stdio upstream never
                router.routed += 1  # asks for a sign-in: a fault is the fault result)
                self._count("route")
                route, arguments = routed
                try:
                    result = await route.call(arguments, self._progress(params), forwarded_meta(params), origin)
                except Fault as fault:
                    result = fault_result(fault)
                except Exception as exc:  # as the layers' `_run_tool` answers it
                    log.exception("tool failed", tool=params.get("name"))
                    result = internal_error_result(str(params.get("name")), exc)
        except Exception as exc:  # as the SDK's dispatcher answers a handler's exception
            return _error_answer(request_id, method, exc)
        return _result_line(request_id, method, result, version, router.server.lowlevel.cache_hints.get(method))

    def _progress(self, params: Mapping[str, Any]) -> Any:
        """The client's progress token, reported to as the SDK's `report_progress` does (never blocking)."""
        meta = params.get("_meta")
        token = meta.get("progressToken") if type(meta) is dict or isinstance(meta, Mapping) else None
        if not isinstance(token, str | int) or isinstance(token, bool):  # as the SDK reads it
            return _no_progress
        replies = self._replies

        async def report(progress: float, total: float | None, message: str | None) -> None:
            body: dict[str, Any] = {"progressToken": token, "progress": progress}
            if total is not None:
                body["total"] = total
            if message is not None:
                body["message"] = message
            try:  # from the upstream's reader: never wait on a client that does not read
                replies.send_nowait(json_line({"jsonrpc": "2.0", "method": "notifications/progress", "params": body}))
            except anyio.WouldBlock:
                log.debug("progress not relayed: the client's writer is full", token=token)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

        return report


async def _no_progress(progress: float, total: float | None, message: str | None) -> None:
    return None


def _result_line(request_id: Any, method: str, result: Any, version: str, hint: CacheHint | None) -> bytes:
    """The answer as the full path writes it: for `tools/call` `_call_result`'s check; then the SDK
    runner's cache hint, dump and sieve for the client's version (one validation does the check and
    the sieve; a plain text result needs neither, `raw_checks.py`), in a response with the client's id.
    No era stamp (`passthrough.for_era`): a 2026-07-28 client never takes this lane (rule `era`)."""
    if hint is not None and isinstance(result, Mapping) and not is_input_required(result):
        result = {"ttlMs": hint.ttl_ms, "cacheScope": hint.scope, **result}
    try:
        plain = plain_text_result(result) if method == "tools/call" else None
        dumped = plain if plain is not None else serialize_server_result(method, version, _dumped(result))
    except ValidationError as exc:
        if method != "tools/call":
            log.exception("handler for %r returned an invalid result", method)
            return _encoded_error(request_id, types.ErrorData(code=types.INTERNAL_ERROR, message=INVALID_RESULT))
        dumped = serialize_server_result(method, version, _dumped(invalid_result(exc)))  # as `_call_result`
    try:
        return json_line({"jsonrpc": "2.0", "id": request_id, "result": dumped})
    except (ValueError, TypeError) as exc:
        log.warning("a message could not be serialised", kind="JSONRPCResponse", error=str(exc)[:200])
        return error_line(request_id, types.INTERNAL_ERROR, "the answer could not be serialised as JSON")


def _error_answer(request_id: Any, method: str, exc: Exception) -> bytes:
    """A handler's exception as the SDK's dispatcher answers it (`handler_exception_to_error_data`)."""
    if isinstance(exc, MCPError):
        error = exc.error
    elif isinstance(exc, ValidationError):
        error = types.ErrorData(code=types.INVALID_PARAMS, message="Invalid request parameters", data="")
    else:
        log.error("handler raised", method=method, error=f"{type(exc).__name__}: {exc}"[:300])
        error = types.ErrorData(code=0, message=str(exc))
    return _encoded_error(request_id, error)


def _encoded_error(request_id: Any, error: types.ErrorData) -> bytes:
    return encode(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)))


def _dumped(result: Any) -> dict[str, Any]:
    if isinstance(result, BaseModel):
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dict(result)
