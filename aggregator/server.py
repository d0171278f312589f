"""The downstream MCP server: tool registry, direct exposure, list_changed fan-out.

One low-level `mcp.server.Server` serves the aggregator's own tools (package
`aggregator`) plus the directly exposed upstream tools. Requests flow
client → here → a tool family → catalog or upstream pool → one upstream.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
from mcp.server import Server
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types.methods import validate_server_result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from aggregator import __version__
from aggregator.catalog.model import Catalog
from aggregator.catalog.search import ToolSearchIndex
from aggregator.exposure import DirectTool, build_direct_tools
from aggregator.faults import Fault
from aggregator.log import get_logger, redact_text
from aggregator.tools.base import OwnTool, ToolContext, fault_result, text_result
from aggregator.tools.catalog import CatalogTools
from aggregator.tools.introspection import introspection_tools
from aggregator.tools.text_search import TextSearchTools
from aggregator.upstream.pool import UpstreamPool

log = get_logger(__name__)

INSTRUCTIONS = """\
This server fronts {count} MCP servers ({names}). Their tools are not listed one by one:
1. Find a tool: catalog_search_tools(query="what you want to do");
   add load=true to also start servers not yet running.
2. Check its arguments: catalog_describe_tool(server, tool).
3. Call it: catalog_call_tool(server, tool, arguments={{...}}); the result is the tool's own.
Browse with catalog_list_servers and catalog_list_tools(server). apropos-search and who-references
find names and parameters across catalogs; search_create_index, search_add_document and search_index
keep your own notes."""


class _Server(Server[Any]):
    """The low-level server, advertising `tools.listChanged` on every transport."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


class AggregatorServer:
    def __init__(self, pool: UpstreamPool, *, data_dir: Path, max_result_bytes: int) -> None:
        self.pool = pool
        self.index = ToolSearchIndex()
        for name in pool.upstream_names():
            self.index.set_server_metadata(name, *pool.metadata(name))
        self.index.attach(pool.store)
        self.text_search = TextSearchTools(data_dir)
        self.catalog_tools = CatalogTools(pool, self.index, max_result_bytes, lambda: self._own)
        self.own_tools: list[OwnTool] = [
            *self.catalog_tools.tools(),
            *introspection_tools(pool, lambda: self.own_tools),
            *self.text_search.tools(),
        ]
        self._own = {tool.name: tool for tool in self.own_tools}
        self._own_wire = [types.Tool.model_validate(tool.to_wire()) for tool in self.own_tools]
        self._direct_predicates = {
            name: upstream.is_direct
            for name, upstream in pool.config.upstreams.items()
            if upstream.expose == "direct" or upstream.pin
        }
        self._direct: dict[str, DirectTool] = {}
        self._direct_catalogs: dict[str, Catalog] = {}  # the last catalog each direct upstream listed
        self._listing: types.ListToolsResult | None = None
        self._changed = anyio.Event()
        self._legacy_sessions: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.bus = InMemorySubscriptionBus()
        self.listen = ListenHandler(self.bus)
        self.lowlevel = _Server(
            "aggregator",
            version=__version__,
            instructions=self._instructions(),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self.listen,
        )
        # The SDK wraps every request in an OpenTelemetry span; without a configured tracer that is pure
        # per-call cost on the proxy's hot path, so keep it only when the operator asked for tracing.
        if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            self.lowlevel.middleware = [
                m for m in self.lowlevel.middleware if not isinstance(m, OpenTelemetryMiddleware)
            ]
        self.lowlevel.middleware.append(self._track_session)
        pool.store.subscribe(self._on_catalog)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[AggregatorServer]:
        """Run the list_changed fan-out beside the server; close indexes on exit."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._fan_out)
                try:
                    yield self
                finally:
                    tg.cancel_scope.cancel()
        finally:
            self.listen.close()
            self.text_search.close()

    def _instructions(self) -> str:
        names = self.pool.upstream_names()
        shown = ", ".join(names[:12]) + (", …" if len(names) > 12 else "")
        return INSTRUCTIONS.format(count=len(names), names=shown or "none configured")

    # ------------------------------------------------------------ tools/list

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        await self._start_direct_upstreams()
        if self._listing is None:
            self._listing = types.ListToolsResult(
                tools=[*self._own_wire, *(direct.wire for direct in self._direct.values())]
            )
        return self._listing

    async def _start_direct_upstreams(self) -> None:
        """A direct upstream's listing is a need (DESIGN §3): start those not loaded, concurrently."""
        pending = [
            name
            for name in self._direct_predicates
            if name not in self._direct_catalogs and not self.pool.in_backoff(name)
        ]
        if pending:
            await self.pool.start_all(pending)

    def _on_catalog(self, server: str, catalog: Catalog | None) -> None:
        """Rebuild the direct table when a direct upstream lists a (new) catalog.

        A dropped catalog (crash, stop) keeps its tools listed: a call then restarts
        the upstream, or answers `upstream_unavailable` inside the backoff window,
        instead of the tool vanishing from the client's list.
        """
        if server not in self._direct_predicates or catalog is None:
            return
        self._direct_catalogs[server] = catalog
        table = build_direct_tools(self._direct_catalogs, self._direct_predicates, self._own)
        if [(d.exposed, d.wire) for d in table.values()] != [(d.exposed, d.wire) for d in self._direct.values()]:
            self._direct = table
            self._listing = None
            self._changed.set()

    async def _fan_out(self) -> None:
        """Tell every client that the tool list changed (legacy sessions and modern listeners)."""
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            await self.bus.publish(ToolsListChanged())
            for connection, session in list(self._legacy_sessions.items()):
                try:
                    await session.send_tool_list_changed()
                except Exception as exc:
                    log.debug("list_changed not delivered", error=str(exc))
                    self._legacy_sessions.pop(connection, None)

    async def _track_session(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        session = ctx.session
        connection = getattr(session, "_connection", None)
        if connection is not None and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            self._legacy_sessions[connection] = session
        return await call_next(ctx)

    # ------------------------------------------------------------ tools/call

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        name = params.name
        arguments: Mapping[str, Any] = params.arguments or {}
        tool_ctx = ToolContext(report_progress=ctx.session.report_progress)
        try:
            own = self._own.get(name)
            if own is not None:
                return _for_era(await own.handler(arguments, tool_ctx), ctx.protocol_version)
            direct = self._direct.get(name)
            if direct is not None:
                result = await self.pool.call_tool(direct.server, direct.tool, arguments, tool_ctx.report_progress)
                return _for_era(result, ctx.protocol_version)
            return fault_result(Fault("unknown_tool", f"no tool named {name!r}; use catalog_search_tools"))
        except Fault as fault:
            return fault_result(fault)
        except Exception as exc:
            log.exception("tool failed", tool=name)
            message = redact_text(f"internal error in aggregator tool {name}: {type(exc).__name__}: {exc}")
            return text_result(message, is_error=True)


def _for_era(result: Any, protocol_version: str) -> Any:
    """An upstream's raw result, stamped with what the client's protocol era requires.

    A 2026-07-28 client requires `resultType` on every result; upstreams of the
    handshake era never send it. Nothing else is touched. A result the client's
    protocol forbids (no content, content not a list, ...) becomes a fault result:
    the SDK would otherwise answer JSON-RPC -32603 and log a traceback.
    """
    if not isinstance(result, dict):
        return result
    if protocol_version in MODERN_PROTOCOL_VERSIONS and "resultType" not in result:
        result = {**result, "resultType": "complete"}
    try:
        validate_server_result("tools/call", protocol_version, result)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "result"
        return fault_result(Fault("upstream_error", f"the upstream's result is invalid: {where}: {first['msg']}"))
    return result
