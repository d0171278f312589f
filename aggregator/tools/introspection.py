"""Catalog introspection tools: `apropos-search` and `who-references` (DESIGN §2.4).

Both read cached catalogs only (`source.store.loaded()`, plus `ensure_catalog`
for an explicitly named package); they never call a tool, read a resource or
get a prompt. Answers are plain text with `isError: false`, as the seeds say,
for every well-formed call, including these decisions of ours:

- a package that exists but cannot be loaded answers
  `Package X could not be loaded: MESSAGE (REASON)`: informational, like the
  seeds' other lookup failures; the reason code says whether retrying may help;
- an empty string for the optional `package` or `type` means "not given"
  (some clients send "" for fields the user left blank);
- an unscoped answer ends, after a blank line, with
  `Not searched (catalog not loaded): a, b. Pass package=NAME to load and search one.`
  when some configured upstream's catalog is not loaded (both tools: a "not
  found" must never be silently incomplete); the line is absent when all are loaded;
- catalogs read from on-disk snapshots (upstream not started yet) are searched
  like loaded ones, and the answer ends with
  `From snapshots (not started yet): a (3h old), b (2d old).`

A malformed call (a required argument missing, an argument of the wrong JSON
type) is the caller's bug, not a lookup result: it answers
`Invalid arguments: ...` with `isError: true`.

The symbol table is rebuilt only when the catalog state changes (a catalog
object replaced in the store, or a different set of own tools).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mcp.types as types
import structlog

from aggregator.catalog.caps import DEFAULT_MAX_RESULT_BYTES
from aggregator.catalog.model import Catalog, MalformedEntry, ToolEntry, age_text, clean_tool
from aggregator.catalog.source import CatalogSource
from aggregator.catalog.symbols import (
    AGGREGATOR_PACKAGE,
    TYPE_FILTERS,
    SymbolTable,
    parse_type_filter,
)
from aggregator.faults import Fault
from aggregator.tools.base import READ_ONLY, OwnTool, ToolContext, text_result

log = structlog.get_logger(__name__)

OwnTools = Callable[[], Sequence[OwnTool]]

_TYPE_ENUM = list(TYPE_FILTERS)

APROPOS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["pattern"],
    "properties": {
        "pattern": {
            "type": "string",
            "description": "Search pattern (case-insensitive substring of the entry name; empty matches all)",
        },
        "package": {
            "type": "string",
            "description": "Limit the search to this upstream (or 'aggregator'), all its entries, "
            "hidden ones included; loads its catalog if needed (optional)",
        },
        "type": {
            "type": "string",
            "description": "Filter by type: tool, prompt, resource, resource-template, generic-function "
            "(the aliases function, macro, variable, class are accepted)",
            "enum": _TYPE_ENUM,
        },
    },
}

WHO_REFERENCES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {
            "type": "string",
            "description": "Parameter name to find (case-insensitive, exact): a tool input-schema "
            "property at any depth, a prompt argument, or a resource-template {var}",
        },
        "package": {
            "type": "string",
            "description": "Limit the search to this upstream (or 'aggregator'), hidden entries included; "
            "loads its catalog if needed (optional)",
        },
    },
}

APROPOS_DESCRIPTION = (
    "Search the aggregated catalog for tools, prompts, resources and resource templates whose name "
    "contains a pattern. Returns PACKAGE::NAME [TYPE] lines; a tool offered by two or more packages is "
    "a GENERIC-FUNCTION. Without package it searches the exposed entries of every loaded upstream plus "
    "the aggregator's own tools and names the upstreams not loaded. Reads cached catalogs only."
)
WHO_REFERENCES_DESCRIPTION = (
    "Find every tool, prompt and resource template that uses a given parameter name: tool input-schema "
    "properties at any depth, prompt arguments, resource-template {variables}. Each entry is followed by "
    "'at' lines saying where. Reads cached catalogs only."
)


class BadCall(ValueError):
    """A malformed call: the message is answered with isError true."""


# ---------------------------------------------------------------- arguments


def required_str(arguments: Mapping[str, Any], key: str) -> str:
    """A required string argument; any string, the empty one included, is accepted."""
    value = arguments.get(key)
    if value is None:
        raise BadCall(f"Invalid arguments: '{key}' is required")
    if not isinstance(value, str):
        raise BadCall(f"Invalid arguments: '{key}' must be a string, not {type(value).__name__}")
    return value


def optional_str(arguments: Mapping[str, Any], key: str) -> str | None:
    """An optional string argument; null and "" count as absent."""
    value = arguments.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadCall(f"Invalid arguments: '{key}' must be a string, not {type(value).__name__}")
    return value


# ---------------------------------------------------------------- the table cache


def own_tool_entries(tools: Sequence[OwnTool]) -> tuple[ToolEntry, ...]:
    """The aggregator's own tools as catalog entries of package `aggregator`."""
    entries: list[ToolEntry] = []
    for tool in tools:
        try:
            entries.append(clean_tool(AGGREGATOR_PACKAGE, tool.to_wire()))
        except MalformedEntry as exc:  # a bug in a tool family; do not break introspection
            log.warning("own tool skipped by introspection", tool=tool.name, reason=str(exc))
    return tuple(entries)


def _same_state(
    old: tuple[tuple[tuple[str, Catalog], ...], tuple[OwnTool, ...]],
    new: tuple[tuple[tuple[str, Catalog], ...], tuple[OwnTool, ...]],
) -> bool:
    (old_cats, old_own), (new_cats, new_own) = old, new
    if len(old_cats) != len(new_cats) or len(old_own) != len(new_own):
        return False
    if any(a[0] != b[0] or a[1] is not b[1] for a, b in zip(old_cats, new_cats, strict=True)):
        return False
    return all(a is b or a == b for a, b in zip(old_own, new_own, strict=True))


class TableCache:
    """The symbol table of the last catalog state seen; rebuilt when that state changes.

    Catalogs are immutable and the store replaces them on change, so identity is
    an exact change test (the cache holds the objects, ids cannot be reused).
    """

    def __init__(self) -> None:
        self._state: tuple[tuple[tuple[str, Catalog], ...], tuple[OwnTool, ...]] | None = None
        self._table: SymbolTable | None = None

    def table(self, catalogs: Mapping[str, Catalog], own: Sequence[OwnTool]) -> SymbolTable:
        state = (tuple(catalogs.items()), tuple(own))
        if self._table is None or self._state is None or not _same_state(self._state, state):
            self._table = SymbolTable(catalogs, own_tool_entries(own))
            self._state = state
        return self._table


# ---------------------------------------------------------------- scope


@dataclass(frozen=True, slots=True)
class Scope:
    """What one call searches: a table, a package or None (unscoped), the unloaded upstreams and the snapshots."""

    table: SymbolTable
    package: str | None
    unloaded: tuple[str, ...]
    snapshots: tuple[Catalog, ...] = ()  # searched catalogs that come from snapshots

    def finish(self, lines: list[str]) -> str:
        """The answer text: `lines`, then the not-loaded and snapshot notes, after one blank line."""
        notes = []
        if self.package is None and self.unloaded:
            names = ", ".join(self.unloaded)
            notes.append(f"Not searched (catalog not loaded): {names}. Pass package=NAME to load and search one.")
        if self.snapshots:
            ages = ", ".join(f"{c.server} ({age_text(c.age())} old)" for c in self.snapshots)
            notes.append(f"From snapshots (not started yet): {ages}.")
        if notes and lines[-1] != "":
            lines.append("")
        return "\n".join(lines + notes)


async def open_scope(source: CatalogSource, own_tools: OwnTools, cache: TableCache, package: str | None) -> Scope | str:
    """The scope of a call, or the informational message that answers it instead."""
    catalogs = dict(source.store.loaded())
    if package is None:
        unloaded = tuple(n for n in source.upstream_names() if n not in catalogs)
        snapshots = tuple(c for c in catalogs.values() if c.is_snapshot)
        return Scope(cache.table(catalogs, own_tools()), None, unloaded, snapshots)
    if package.casefold() == AGGREGATOR_PACKAGE:
        return Scope(cache.table(catalogs, own_tools()), AGGREGATOR_PACKAGE, ())
    canonical = source.resolve(package)
    if canonical is None:
        return f"Package {package} not found"
    if canonical not in catalogs:
        try:
            loaded = await source.ensure_catalog(canonical)
        except Fault as fault:
            if fault.reason == "unknown_server":
                return f"Package {package} not found"
            return f"Package {package} could not be loaded: {fault.message} ({fault.reason})"
        catalogs = dict(source.store.loaded())
        catalogs.setdefault(canonical, loaded)
    scoped = catalogs[canonical]
    return Scope(cache.table(catalogs, own_tools()), canonical, (), (scoped,) if scoped.is_snapshot else ())


# ---------------------------------------------------------------- the tools


def _plural(count: int) -> str:
    return "symbol" if count == 1 else "symbols"


def cap_lines(lines: list[str], max_bytes: int, what: str, hint: str) -> list[str]:
    """The longest prefix of `lines` within `max_bytes` of UTF-8, plus a line saying how many were left out."""
    kept, size = 0, 0
    for line in lines:
        size += len(line.encode("utf-8", "replace")) + 1
        if size > max_bytes:
            break
        kept += 1
    if kept == len(lines):
        return lines
    left = len(lines) - kept
    return [*lines[:kept], f"... {left} more {what} not shown (answers are capped at {max_bytes} bytes); {hint}"]


async def apropos_search(
    source: CatalogSource,
    own_tools: OwnTools,
    cache: TableCache,
    arguments: Mapping[str, Any],
    max_bytes: int = DEFAULT_MAX_RESULT_BYTES,
) -> types.CallToolResult:
    pattern = required_str(arguments, "pattern")
    package = optional_str(arguments, "package")
    type_arg = optional_str(arguments, "type")
    type_ = None
    if type_arg is not None:
        type_ = parse_type_filter(type_arg)
        if type_ is None:
            return text_result(f"Invalid type: {type_arg}. Valid types: {', '.join(TYPE_FILTERS)}")
    scope = await open_scope(source, own_tools, cache, package)
    if isinstance(scope, str):
        return text_result(scope)
    found = scope.table.apropos(pattern, scope.package, type_)
    lines = [f"Found {len(found)} {_plural(len(found))} matching '{pattern}':", ""]
    lines.extend(cap_lines([s.line for s in found], max_bytes, "symbols", "narrow the pattern or pass package or type"))
    return text_result(scope.finish(lines))


async def who_references(
    source: CatalogSource,
    own_tools: OwnTools,
    cache: TableCache,
    arguments: Mapping[str, Any],
    max_bytes: int = DEFAULT_MAX_RESULT_BYTES,
) -> types.CallToolResult:
    name = required_str(arguments, "name")
    package = optional_str(arguments, "package")
    scope = await open_scope(source, own_tools, cache, package)
    if isinstance(scope, str):
        return text_result(scope)
    refs = scope.table.who_references(name, scope.package)
    if not refs:
        lines = [f"No references found for {name}"]
    else:
        lines = [f"Code that references {name}:", ""]
        lines.extend(cap_lines([ref.text for ref in refs], max_bytes, "entries", "pass package to narrow it"))
    return text_result(scope.finish(lines))


def introspection_tools(
    source: CatalogSource, own_tools: OwnTools, max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
) -> list[OwnTool]:
    """The tools `apropos-search` and `who-references`, reading `source`'s catalogs.

    `own_tools()` returns every tool the aggregator serves itself (these two
    included); they are package `aggregator`. It is called once per request.
    Their entry lines are cut to about `max_result_bytes`, saying how many were left out.
    """
    cache = TableCache()

    async def apropos(arguments: Mapping[str, Any], ctx: ToolContext) -> types.CallToolResult:
        try:
            return await apropos_search(source, own_tools, cache, arguments, max_result_bytes)
        except BadCall as exc:
            return text_result(str(exc), is_error=True)

    async def references(arguments: Mapping[str, Any], ctx: ToolContext) -> types.CallToolResult:
        try:
            return await who_references(source, own_tools, cache, arguments, max_result_bytes)
        except BadCall as exc:
            return text_result(str(exc), is_error=True)

    return [
        OwnTool("apropos-search", APROPOS_DESCRIPTION, APROPOS_SCHEMA, apropos, annotations=READ_ONLY),
        OwnTool(
            "who-references",
            WHO_REFERENCES_DESCRIPTION,
            WHO_REFERENCES_SCHEMA,
            references,
            annotations=READ_ONLY,
        ),
    ]
