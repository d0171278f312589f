"""The downstream MCP server: tool registry, direct exposure, list_changed fan-out.

One low-level `mcp.server.Server` serves the aggregator's own tools (package
`aggregator`) plus the directly exposed upstream tools, and hands the rest of
the protocol (prompts, resources, completions, logging, tasks, and the
upstreams' requests to the client) to `aggregator.proxy.passthrough`. Requests flow
client → here → a tool family or the pass-through → catalog or upstream pool →
one upstream.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
from mcp.server import Server
from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.methods import validate_server_result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from aggregator import __version__
from aggregator.catalog.caps import capped_text
from aggregator.catalog.model import Catalog
from aggregator.catalog.search import ToolSearchIndex
from aggregator.config import AggregatorConfig, ConfigError
from aggregator.faults import Fault, SignInNeeded
from aggregator.log import get_logger
from aggregator.proxy.exposure import Clash, DirectTool, build_direct_tools, log_clashes, name_prefixes
from aggregator.proxy.passthrough import Passthrough, caller_of, for_era
from aggregator.proxy.raw import RawLane, RawRouter
from aggregator.proxy.relay import Clients
from aggregator.proxy.routing import build_prompt_table
from aggregator.proxy.sign_in import RETRY, offer_sign_in, sign_in_link
from aggregator.sdk import client_connection, without_tracing
from aggregator.suggest import closest
from aggregator.tools.base import OwnTool, ToolContext, fault_result, internal_error_result, invalid_result
from aggregator.tools.catalog import CATALOG_CALL, CatalogTools
from aggregator.tools.introspection import introspection_tools
from aggregator.tools.text_search import DEFAULT_MAX_K, TextSearchTools
from aggregator.upstream.pool import ConfigDiff, UpstreamPool

log = get_logger(__name__)

INSTRUCTIONS_HEAD = "This server fronts {count} MCP servers ({names})."
INSTRUCTIONS_CATALOG = """\
The tools of {names} are not listed one by one:
1. Find a tool: catalog_search_tools(query="what you want to do");
   add load=true to also start servers not yet running.
2. Check its arguments: catalog_describe_tool(server, tool).
3. Call it: catalog_call_tool(server, tool, arguments={{...}}); the result is the tool's own.
Browse with catalog_list_servers and catalog_list_tools(server)."""
INSTRUCTIONS_DIRECT = "The tools of {names} are listed directly, named <server>__<tool>{unless}."
INSTRUCTIONS_TAIL = """\
Their prompts are listed as <server>__<prompt>{unless}; their resources keep their own URIs.
apropos-search and who-references find names and parameters across catalogs; search_create_index,
search_add_document and search_index keep your own notes."""
UPSTREAM_INSTRUCTIONS_CHARS = 1000  # per direct upstream, in our own instructions


class _Server(Server[Any]):
    """The low-level server: list_changed for tools, prompts and resources on every transport, tasks,
    and instructions computed when a client connects (they name what is running by then)."""

    instructions_source: Callable[[], str] | None = None

    @property  # type: ignore[override]
    def instructions(self) -> str | None:
        return self.instructions_source() if self.instructions_source is not None else self._instructions

    @instructions.setter
    def instructions(self, value: str | None) -> None:
        self._instructions = value

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options
            or NotificationOptions(tools_changed=True, prompts_changed=True, resources_changed=True),
            experimental_capabilities,
            extensions,
        )

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        caps = super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )
        if protocol_version in MODERN_PROTOCOL_VERSIONS:
            return caps
        tasks = types.ServerTasksCapability(
            list=types.TasksListCapability(),
            cancel=types.TasksCancelCapability(),
            requests=types.ServerTasksRequestsCapability(
                tools=types.TasksToolsCapability(call=types.TasksCallCapability())
            ),
        )
        return caps.model_copy(update={"tasks": tasks})


class AggregatorServer:
    def __init__(
        self, pool: UpstreamPool, *, data_dir: Path, max_result_bytes: int, search_max_k: int = DEFAULT_MAX_K
    ) -> None:
        self.pool = pool
        self.index = ToolSearchIndex()
        for name in pool.upstream_names():
            self.index.set_server_metadata(name, *pool.metadata(name))
        self.index.attach(pool.store)
        self.text_search = TextSearchTools(data_dir, max_k=search_max_k, max_result_bytes=max_result_bytes)
        self.catalog_tools = CatalogTools(
            pool, self.index, max_result_bytes, lambda: self._own, partial(sign_in_link, pool)
        )
        families = pool.config.own_tools  # `own_tools:` in the config; the catalog tools always
        self.own_tools: list[OwnTool] = [
            *self.catalog_tools.tools(),
            *(introspection_tools(pool, lambda: self.own_tools, max_result_bytes) if families.introspection else []),
            *(self.text_search.tools() if families.text_index else []),
        ]
        self._own = {tool.name: tool for tool in self.own_tools}
        self._own_wire = [types.Tool.model_validate(tool.to_wire()) for tool in self.own_tools]
        self._direct_predicates = _direct_predicates(pool.config)
        self._direct: dict[str, DirectTool] = {}
        self._clashes: set[Clash] = set()  # direct tool names claimed twice, reported once
        self._direct_catalogs: dict[str, Catalog] = {}  # the last catalog each direct upstream listed
        self._listing: types.ListToolsResult | None = None
        self._changed = anyio.Event()
        self._tools_changed = False
        self.clients = Clients()
        self.bus = InMemorySubscriptionBus()
        self.listen = ListenHandler(self.bus)
        self.passthrough = Passthrough(pool, self.clients, self.bus)
        self.raw = RawRouter(self)
        self.passthrough.on_change = lambda: self._changed.set()  # the event is replaced after each fan-out
        pt = self.passthrough
        self.lowlevel = _Server(
            "aggregator",
            version=__version__,
            # A 2026-07-28 resources/read result must say how long it may be cached; an upstream of the
            # handshake era never does. A proxy cannot know: immediately stale, never shared.
            cache_hints={"resources/read": CacheHint(ttl_ms=0, scope="private")},
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self.listen,
            on_list_prompts=pt.list_prompts,
            on_get_prompt=pt.get_prompt,  # type: ignore[arg-type]  # raw result dicts pass through
            on_list_resources=pt.list_resources,
            on_list_resource_templates=pt.list_resource_templates,
            on_read_resource=pt.read_resource,  # type: ignore[arg-type]
            on_subscribe_resource=pt.subscribe,  # type: ignore[arg-type]
            on_unsubscribe_resource=pt.unsubscribe,  # type: ignore[arg-type]
            on_completion=pt.complete,  # type: ignore[arg-type]
        )
        self.lowlevel.instructions_source = self._instructions
        # Registered directly: the constructor arguments for these warn that 2026-07-28 deprecates them.
        self.lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, pt.set_level)
        self.lowlevel.add_notification_handler(
            "notifications/roots/list_changed", types.NotificationParams, pt.roots_changed
        )
        # The SDK wraps every request in an OpenTelemetry span; without a configured tracer that is pure
        # per-call cost on the proxy's hot path, so keep it only when the operator asked for tracing.
        if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            self.lowlevel.middleware = without_tracing(self.lowlevel.middleware)
        self.lowlevel.middleware.append(self._track_session)
        for name, catalog in pool.store.loaded().items():  # snapshots: listed before anything starts
            self._on_catalog(name, catalog)
        self._changed = anyio.Event()  # no client has seen a list yet
        pool.store.subscribe(self._on_catalog)
        pool.on_reconfigure(self._reconfigured)
        self.check_names(pool.config)
        pool.check_config(self.check_names)

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
        """What this server really exposes: catalog upstreams, direct ones, and what the direct ones said."""
        names = self.pool.upstream_names()
        direct = [name for name in names if self.pool.config.upstreams[name].expose == "direct"]
        behind = [name for name in names if name not in direct]
        own_names = [name for name in names if self.pool.config.upstreams[name].prefix is not True]
        unless = f" (those of {_shown(own_names)} as their prefix: says)" if own_names else ""
        parts = [INSTRUCTIONS_HEAD.format(count=len(names), names=_shown(names) or "none configured")]
        if behind:
            parts.append(INSTRUCTIONS_CATALOG.format(names=_shown(behind)))
        if direct:
            parts.append(INSTRUCTIONS_DIRECT.format(names=_shown(direct), unless=unless))
        parts.append(INSTRUCTIONS_TAIL.format(unless=unless))
        for name in direct:
            said = self.pool.instructions(name)
            if said:
                parts.append(f"From {name}: {capped_text(said, UPSTREAM_INSTRUCTIONS_CHARS)}")
        return "\n".join(parts)

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
        """A direct upstream's listing is a need (DESIGN §3): start those not loaded, concurrently, and
        those whose snapshot was listed under fewer client capabilities than offered now."""
        pending = [
            name
            for name in self._direct_predicates
            if (name not in self._direct_catalogs or self.pool.snapshot_falls_short(name))
            and not self.pool.in_backoff(name)
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
        table = self._direct_table(self._direct_predicates)
        if [(d.exposed, d.wire) for d in table.values()] != [(d.exposed, d.wire) for d in self._direct.values()]:
            self._direct = table
            self._listing = None
            self._tools_changed = True
            self._changed.set()

    def _direct_table(self, predicates: Mapping[str, Any]) -> dict[str, DirectTool]:
        clashes: list[Clash] = []
        prefixes = name_prefixes(self.pool.config)
        table = build_direct_tools(self._direct_catalogs, predicates, self._own, prefixes, clashes)
        log_clashes(clashes, self._clashes)
        return table

    def _reconfigured(self, diff: ConfigDiff) -> None:
        """After a config reload: new metadata for search, new direct exposure, list_changed if it changed."""
        for name in [*diff.added, *diff.changed]:
            self.index.set_server_metadata(name, *self.pool.metadata(name))
        for name in [*diff.removed, *diff.changed]:
            self._direct_catalogs.pop(name, None)
        predicates = _direct_predicates(self.pool.config)
        new_direct = set(predicates) != set(self._direct_predicates) or any(name in predicates for name in diff.changed)
        self._direct_predicates = predicates
        table = self._direct_table(predicates)
        if new_direct or list(table) != list(self._direct):
            self._direct = table
            self._listing = None
            self._tools_changed = True
            self._changed.set()  # clients list again; that starts new direct upstreams (DESIGN §3)

    def check_names(self, config: AggregatorConfig) -> None:
        """Raise `ConfigError` naming both owners if `config` would expose a tool or prompt name twice.

        Names come from the catalogs known now (live or snapshot; for an upstream a reload adds, its
        snapshot on disk): at start-up and before a reloaded config is applied. A catalog listed
        later that claims a taken name is logged, and the first owner keeps the name.
        """
        known, running = self.pool.store.loaded(), self.pool.config.upstreams
        catalogs: dict[str, Catalog] = {}
        for name, upstream in config.upstreams.items():
            unchanged = running.get(name) == upstream
            catalog = known.get(name) if unchanged else self.pool.snapshot_on_disk(upstream) or known.get(name)
            if catalog is not None:
                catalogs[name] = catalog
        prefixes = name_prefixes(config)
        clashes: list[Clash] = []
        build_direct_tools(catalogs, _direct_predicates(config), self._own, prefixes, clashes)
        build_prompt_table(catalogs, prefixes, clashes)
        if clashes:
            first = clashes[0]
            more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
            raise ConfigError(
                config.source,
                f"upstreams.{first.second}.prefix",
                first.message() + more,
                f"give upstream {first.second!r} a prefix: (true for {first.second}__, or a string), "
                "or hide the tool with tools: {deny: [...]}",
            )

    async def _fan_out(self) -> None:
        """Tell every client what changed: tools, prompts, resources (legacy sessions and modern listeners)."""
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            legacy = self.clients.legacy()
            if self._tools_changed:
                self._tools_changed = False
                await self.bus.publish(ToolsListChanged())
                for connection in legacy:
                    try:
                        await connection.send_tool_list_changed()
                    except Exception as exc:
                        log.debug("list_changed not delivered", error=str(exc))
                        self.clients.forget(connection)
            await self.passthrough.announce(legacy)

    async def _track_session(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        self.clients.track(ctx)
        if isinstance(ctx.request, RawLane):  # a line-based client's lane learns its connection
            ctx.request.bind(client_connection(ctx.session))
        if ctx.request_id is not None and (
            ctx.method.startswith("tasks/") or (ctx.method == "tools/call" and (ctx.params or {}).get("task"))
        ):
            return await self._task_request(ctx)  # tasks are not in the SDK's method tables: answered raw here
        return await call_next(ctx)

    async def _task_request(self, ctx: ServerRequestContext[Any, Any]) -> HandlerResult:
        if ctx.method != "tools/call":
            return await self.passthrough.task_request(ctx)
        params = ctx.params or {}
        name, arguments = params.get("name"), params.get("arguments") or {}
        if name == CATALOG_CALL and isinstance(arguments, Mapping):
            try:
                tool = await self.catalog_tools.tool_entry(str(arguments.get("server")), str(arguments.get("tool")))
            except Fault as fault:
                raise MCPError(types.INVALID_PARAMS, f"{fault.reason}: {fault.message}") from None
            server, upstream_tool, arguments = tool.server, tool.name, arguments.get("arguments") or {}
        else:
            direct = await self._direct_tool(str(name))
            if direct is None:
                raise MCPError(types.INVALID_PARAMS, f"no tool named {name!r} can run as a task")
            server, upstream_tool = direct.server, direct.tool
        if not isinstance(arguments, Mapping):
            raise MCPError(types.INVALID_PARAMS, "'arguments' must be an object")
        return await self.passthrough.call_as_task(server, upstream_tool, ctx, arguments)

    # ------------------------------------------------------------ tools/call

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        return await self.call_tool_for(params.name, params.arguments or {}, caller_of(ctx), ctx.protocol_version)

    async def call_tool_for(
        self, name: str, arguments: Mapping[str, Any], tool_ctx: ToolContext, protocol_version: str | None
    ) -> Any:
        """A client's `tools/call`, on the full path or the raw one (`proxy/raw.py`).

        One that needs an upstream's sign-in offers the client the link (`proxy/sign_in.py`). The
        result as `_call_result` checks it for `protocol_version`; None: unchecked (the raw path
        checks it with the sieve it must run anyway, `raw_call_result`).
        """
        try:
            return await self._run_tool(name, arguments, tool_ctx, protocol_version)
        except SignInNeeded as needed:
            try:
                if await offer_sign_in(self.pool, needed, tool_ctx.origin) is RETRY:
                    return await self._run_tool(name, arguments, tool_ctx, protocol_version)
            except Fault as fault:
                return fault_result(fault)
            return fault_result(needed)

    async def _run_tool(
        self, name: str, arguments: Mapping[str, Any], tool_ctx: ToolContext, protocol_version: str | None
    ) -> Any:
        try:
            own = self._own.get(name)
            if own is not None:
                return _call_result(await own.handler(arguments, tool_ctx), protocol_version)
            direct = await self._direct_tool(name)
            if direct is not None:
                result = await self.pool.call_tool(
                    direct.server,
                    direct.tool,
                    arguments,
                    tool_ctx.report_progress,
                    extra=tool_ctx.extra,
                    origin=tool_ctx.origin,
                )
                return _call_result(result, protocol_version)
            guess = closest(name, [*self._own, *self._direct])
            hint = f"; did you mean {guess!r}?" if guess else ""
            return fault_result(Fault("unknown_tool", f"no tool named {name!r}{hint}; use catalog_search_tools"))
        except SignInNeeded:
            raise
        except Fault as fault:
            return fault_result(fault)
        except Exception as exc:
            log.exception("tool failed", tool=name)
            return internal_error_result(name, exc)

    @property
    def own_tool_names(self) -> Mapping[str, OwnTool]:
        return self._own

    def direct_tool_now(self, name: str) -> DirectTool | None:
        """The direct tool `name` as listed now (no upstream is started to find it)."""
        return self._direct.get(name)

    async def _direct_tool(self, name: str) -> DirectTool | None:
        """The direct tool `name`; a call before any tools/list starts the direct upstreams to find it."""
        direct = self._direct.get(name)
        if direct is None and any(server not in self._direct_catalogs for server in self._direct_predicates):
            await self._start_direct_upstreams()
            direct = self._direct.get(name)
        return direct


def _direct_predicates(config: AggregatorConfig) -> dict[str, Any]:
    """Upstream name → its `is_direct(tool)` predicate, for upstreams that expose tools directly."""
    return {
        name: upstream.is_direct
        for name, upstream in config.upstreams.items()
        if upstream.expose == "direct" or upstream.pin
    }


def _shown(names: list[str]) -> str:
    return ", ".join(names[:12]) + (", …" if len(names) > 12 else "")


def _call_result(result: Any, protocol_version: str | None) -> Any:
    """An upstream's raw tools/call result as the client's protocol era requires (`for_era`), checked.

    A 2026-07-28 client requires `resultType` on every result; upstreams of the
    handshake era never send it. Nothing else is touched. A result the client's
    protocol forbids (no content, content not a list, ...) becomes a fault result:
    the SDK would otherwise answer JSON-RPC -32603 and log a traceback.
    """
    if protocol_version is None:
        return result
    result = for_era(result, protocol_version)
    if not isinstance(result, dict):
        return result
    try:
        validate_server_result("tools/call", protocol_version, result)
    except ValidationError as exc:
        return invalid_result(exc)
    return result
