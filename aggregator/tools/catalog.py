"""The catalog tools (DESIGN §2.1): list servers, list tools, describe, call.

`catalog_search_tools` lives in `catalog_search.py`; this module wires it in
beside the others so the family is registered as one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import mcp.types as types

from aggregator.catalog.caps import cap_list, capped_text, json_size
from aggregator.catalog.model import Catalog, ToolEntry
from aggregator.catalog.search import ToolSearchIndex
from aggregator.catalog.symbols import classify_tool
from aggregator.faults import Fault, SignInNeeded, invalid_argument
from aggregator.tools.base import (
    READ_ONLY,
    OwnTool,
    ToolContext,
    ToolResult,
    fault_result,
    json_result,
    snapshot_fields,
)
from aggregator.tools.catalog_search import SignInLink, search_tool
from aggregator.upstream.pool import UpstreamPool, require_tool

CATALOG_CALL = "catalog_call_tool"  # the one spelling of the call tool's name (server.py and raw.py match it)

LIST_LIMIT_DEFAULT = 50
LIST_LIMIT_MAX = 200
INSTRUCTIONS_CHARS = 4000  # per upstream in catalog_list_servers; the byte cap still applies to the whole list

_SERVER_ARG = {"type": "string", "description": "Upstream server name, as catalog_list_servers reports it."}
_TOOL_ARG = {
    "type": "string",
    "description": "Tool name within that server, as catalog_list_tools reports it.",
}


class CatalogTools:
    """The catalog tool family over one upstream pool."""

    def __init__(
        self,
        pool: UpstreamPool,
        index: ToolSearchIndex,
        max_result_bytes: int,
        own_tool_names: Callable[[], Iterable[str]] = tuple,
        sign_in_link: SignInLink | None = None,
    ) -> None:
        self.pool = pool
        self.sign_in_link = sign_in_link  # the link for a client that opens links (a search's `failed`)
        self.index = index
        self.max_result_bytes = max_result_bytes
        self.own_tool_names = own_tool_names  # package `aggregator`, for the apropos classification

    def tools(self) -> list[OwnTool]:
        return [
            OwnTool(
                name="catalog_list_servers",
                description=(
                    "List every upstream MCP server the aggregator fronts: name, description, capabilities, "
                    "transport, state, and tool count (null until its catalog is loaded). Starts nothing."
                ),
                input_schema={"type": "object", "properties": {}, "additionalProperties": False},
                handler=_guarded(self.list_servers),
                annotations=READ_ONLY,
            ),
            OwnTool(
                name="catalog_list_tools",
                description=(
                    "List the tools of one upstream server (sorted by name, paged with limit/offset): "
                    "name, one-line summary, argument names, read-only hint. Starts the server if needed."
                ),
                input_schema={
                    "type": "object",
                    "properties": {
                        "server": _SERVER_ARG,
                        "limit": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT_MAX, "default": 50},
                        "offset": {"type": "integer", "minimum": 0, "default": 0},
                    },
                    "required": ["server"],
                    "additionalProperties": False,
                },
                handler=_guarded(self.list_tools),
                annotations=READ_ONLY,
            ),
            OwnTool(
                name="catalog_describe_tool",
                description=(
                    "Full definition of one upstream tool: description, JSON input schema, output schema, "
                    "annotations, required arguments and a ready-to-fill catalog_call_tool example."
                ),
                input_schema={
                    "type": "object",
                    "properties": {"server": _SERVER_ARG, "tool": _TOOL_ARG},
                    "required": ["server", "tool"],
                    "additionalProperties": False,
                },
                handler=_guarded(self.describe_tool),
                annotations=READ_ONLY,
            ),
            search_tool(self.pool, self.index, self.max_result_bytes, self.sign_in_link),
            OwnTool(
                name=CATALOG_CALL,
                description=(
                    "Call a tool of an upstream server with its arguments; returns that tool's own result "
                    "untouched. Find tools with catalog_search_tools, check arguments with "
                    "catalog_describe_tool."
                ),
                input_schema={
                    "type": "object",
                    "properties": {
                        "server": _SERVER_ARG,
                        "tool": _TOOL_ARG,
                        "arguments": {
                            "type": "object",
                            "description": "The tool's arguments, matching its input schema.",
                            "default": {},
                        },
                    },
                    "required": ["server", "tool"],
                    "additionalProperties": False,
                },
                handler=self.call_tool,
                annotations={"openWorldHint": True},
            ),
        ]

    # ------------------------------------------------------------ handlers

    async def list_servers(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        servers = []
        for status in self.pool.statuses():
            server = {
                "name": status.name,
                "description": status.description,
                "capabilities": status.capabilities,
                "transport": status.transport,
                "state": status.state,
                "tool_count": status.tool_count,
                "catalog_loaded": status.tool_count is not None,
                "instructions": capped_text(status.instructions, INSTRUCTIONS_CHARS) if status.instructions else None,
            }
            if status.tool_count is None and status.snapshot_tool_count is not None:
                server["tool_count"] = status.snapshot_tool_count
                server.update(snapshot_fields(self.pool.store.get(status.name)))
            servers.append(server)
        payload = cap_list(servers, lambda items, cut: {"servers": items, "truncated": cut}, self.max_result_bytes)
        return json_result(payload)

    async def list_tools(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        server = _require_str(arguments, "server")
        limit = _int_arg(arguments, "limit", LIST_LIMIT_DEFAULT, 1, LIST_LIMIT_MAX)
        offset = _int_arg(arguments, "offset", 0, 0, None)
        catalog = await self._catalog(server)
        tools = catalog.exposed_tools
        page = [_tool_item(t) for t in tools[offset : offset + limit]]
        total = len(tools)

        def build(items: list[Any], cut: bool) -> dict[str, Any]:
            end = offset + len(items)
            more = end < total
            page = {"items": items, "total": total, "truncated": more, "next_offset": end if more else None}
            return page | snapshot_fields(catalog)

        return json_result(cap_list(page, build, self.max_result_bytes))

    async def describe_tool(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        server = _require_str(arguments, "server")
        tool, catalog = await self._tool(server, _require_str(arguments, "tool"))
        example_args = {key: f"<{key}>" for key in tool.required}
        payload = {
            "server": tool.server,
            "tool": tool.name,
            "title": tool.title,
            "description": tool.description,
            "input_schema": dict(tool.input_schema),
            "output_schema": dict(tool.output_schema) if tool.output_schema is not None else None,
            "annotations": dict(tool.annotations) if tool.annotations is not None else None,
            "arg_keys": tool.arg_keys,
            "required": tool.required,
            "execution": tool.wire.get("execution"),  # taskSupport "required": call with a `task` param
            "symbol_type": classify_tool(tool.name, self.pool.store.loaded(), self.own_tool_names()).upper(),
            "call_example": {
                "tool": CATALOG_CALL,
                "arguments": {"server": tool.server, "tool": tool.name, "arguments": example_args},
            },
            **snapshot_fields(catalog),
        }
        if json_size(payload) > self.max_result_bytes:
            raise Fault("result_too_large", f"the definition of {server}/{tool.name} exceeds max_result_bytes")
        return json_result(payload)

    async def call_tool(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            server = _require_str(arguments, "server")
            name = _require_str(arguments, "tool")
            args = arguments.get("arguments", {})
            if args is None:
                args = {}
            if not isinstance(args, Mapping):
                raise invalid_argument("'arguments' must be an object of the tool's arguments")
            tool, _ = await self._tool(server, name, live=True)  # proves the tool exists, resolves the case
            return await self.pool.call_tool(
                tool.server, tool.name, args, ctx.report_progress, extra=ctx.extra, origin=ctx.origin
            )
        except SignInNeeded:
            raise  # the server may offer the client the sign-in
        except Fault as fault:
            return fault_result(fault)

    # ------------------------------------------------------------ lookups

    def _resolve(self, server: str) -> str:
        name = self.pool.resolve(server)
        if name is None:
            self.pool.connection(server)  # raises unknown_server with the known names
        return name or server

    async def _catalog(self, server: str) -> Catalog:
        """The server's current catalog (a snapshot will do), starting it if there is none."""
        return await self.pool.ensure_catalog(self._resolve(server))

    async def _tool(self, server: str, tool: str, *, live: bool = False) -> tuple[ToolEntry, Catalog]:
        """The exposed tool and the catalog it came from (`live`: the running upstream's), or `unknown_tool`.

        Only a live catalog proves a tool absent: one missing from a snapshot is
        looked up again in the live catalog (which starts the upstream).
        """
        name = self._resolve(server)
        before = self.pool.store.get(name)  # a snapshot that the live load below may replace
        catalog = await (self.pool.ensure_live_catalog(name) if live else self.pool.ensure_catalog(name))
        entry = catalog.tool(tool)
        if (entry is None or entry.hidden) and catalog.is_snapshot:
            catalog = await self.pool.ensure_live_catalog(name)
        return require_tool(catalog, tool, before), catalog

    async def tool_entry(self, server: str, tool: str) -> ToolEntry:
        """The exposed tool `tool` of the running `server` (matched ignoring case), for a call."""
        entry, _ = await self._tool(server, tool, live=True)
        return entry


# ---------------------------------------------------------------- helpers


def _tool_item(tool: ToolEntry) -> dict[str, Any]:
    return {
        "server": tool.server,
        "tool": tool.name,
        "summary": tool.summary,
        "arg_keys": tool.arg_keys,
        "read_only": tool.read_only,
    }


def _guarded(
    handler: Callable[[Mapping[str, Any], ToolContext], Any],
) -> Callable[[Mapping[str, Any], ToolContext], Any]:
    """Turn a Fault raised by a handler into the fault result of DESIGN §2.1."""

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            result: types.CallToolResult = await handler(arguments, ctx)
            return result
        except SignInNeeded:
            raise  # the server may offer the client the sign-in
        except Fault as fault:
            return fault_result(fault)

    return run


def _require_str(arguments: Mapping[str, Any], key: str) -> str:
    value = arguments.get(key)
    if not isinstance(value, str) or not value.strip():
        raise invalid_argument(f"'{key}' must be a non-empty string")
    return value


def _int_arg(arguments: Mapping[str, Any], key: str, default: int, low: int, high: int | None) -> int:
    value = arguments.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_argument(f"'{key}' must be an integer")
    if value < low or (high is not None and value > high):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise invalid_argument(f"'{key}' must be in {bounds}, got {value}")
    return value
