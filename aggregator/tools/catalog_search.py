"""`catalog_search_tools`: deterministic lexical search over every upstream's tools (DESIGN §2.2).

The ranking lives in `aggregator.catalog.search`; this module validates the
call, starts upstreams for `load: true`, turns hits into the result shape and
applies the byte cap. `format_results_table` renders a result for the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any

import anyio
import mcp.types as types

from aggregator.catalog.caps import cap_list
from aggregator.catalog.model import Catalog, summarize
from aggregator.catalog.search import Hit, ServerHit, ToolSearchIndex
from aggregator.catalog.source import CatalogSource
from aggregator.faults import Fault, SignInNeeded, invalid_argument
from aggregator.table import render_table
from aggregator.tools.base import READ_ONLY, OwnTool, ToolContext, fault_result, json_result, snapshot_fields

TOOL_NAME = "catalog_search_tools"
LIMIT_DEFAULT = 8
LIMIT_MAX = 50
MAX_QUERY_CHARS = 1000  # a longer "query" is a document, not a question; it would only cost time
SCORE_DIGITS = 4
SUMMARY_COLUMN = 80  # characters of a summary shown by format_results_table

DESCRIPTION = (
    "Find upstream tools for a task. Query in words ('convert a time between time zones') or keywords "
    "('git diff'); results are ranked: server, tool, summary, argument names. Call one with catalog_call_tool "
    "(catalog_describe_tool shows its schema). A server not started yet may match on its name and description "
    "alone (tool: null): list its tools with catalog_list_tools, or pass load: true to start such servers and "
    "search their tools (slower; those that fail are listed under 'failed')."
)

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "What you want to do, in words or keywords.",
            "maxLength": MAX_QUERY_CHARS,
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": LIMIT_MAX,
            "default": LIMIT_DEFAULT,
            "description": "Most results to return.",
        },
        "load": {
            "type": "boolean",
            "default": False,
            "description": "Start upstreams whose catalogs are not loaded and search their tools too.",
        },
    },
    "required": ["query"],
    "additionalProperties": False,
}


SignInLink = Callable[[SignInNeeded, Any], Awaitable[dict[str, str] | str | None]]
"""The sign-in link offered to the client of a request's origin alone (`proxy/sign_in.sign_in_link`)."""


def search_tool(
    source: CatalogSource, index: ToolSearchIndex, max_result_bytes: int, sign_in_link: SignInLink | None = None
) -> OwnTool:
    """The `catalog_search_tools` tool over `source`, ranking with `index`; `sign_in_link`: with
    `load: true`, an upstream that needs a sign-in is listed under `failed` with the link for a client
    that opens links (the search itself never fails because of one upstream)."""

    async def handler(arguments: Mapping[str, Any], ctx: ToolContext) -> types.CallToolResult:
        offer = None if sign_in_link is None else partial(_offered, sign_in_link, ctx.origin)
        return await search_tools(source, index, arguments, max_result_bytes, offer)

    return OwnTool(
        name=TOOL_NAME,
        description=DESCRIPTION,
        input_schema=INPUT_SCHEMA,
        handler=handler,
        title="Search upstream tools",
        annotations=READ_ONLY,
    )


async def search_tools(
    source: CatalogSource,
    index: ToolSearchIndex,
    arguments: Mapping[str, Any],
    max_result_bytes: int,
    sign_in: Callable[[SignInNeeded], Awaitable[dict[str, str]]] | None = None,
) -> types.CallToolResult:
    """Run one search: `{results, truncated}`, plus `failed` when `load: true` could not start some upstream."""
    try:
        query, limit, load = parse_arguments(arguments)
        _sync_metadata(source, index)
        failed = await load_unloaded(source, sign_in) if load else []
        results = rank(source, index, query, limit, with_servers=not load)
        payload = cap_list(results, lambda items, cut: _payload(items, cut, failed), max_result_bytes)
    except Fault as fault:
        return fault_result(fault)
    return json_result(payload)


# ---------------------------------------------------------------- steps


def parse_arguments(arguments: Mapping[str, Any] | None) -> tuple[str, int, bool]:
    """(query, limit, load), or `invalid_argument`."""
    arguments = arguments or {}
    query = arguments.get("query")
    if not isinstance(query, str):
        raise invalid_argument("'query' must be a string: what you want to do, or keywords")
    if not query.strip():
        raise invalid_argument("'query' must not be empty or whitespace")
    if len(query) > MAX_QUERY_CHARS:
        raise invalid_argument(
            f"'query' is {len(query)} characters long; the most is {MAX_QUERY_CHARS}: say it shorter"
        )
    limit = arguments.get("limit")
    if limit is None:
        limit = LIMIT_DEFAULT
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise invalid_argument(f"'limit' must be an integer in 1..{LIMIT_MAX}")
    if not 1 <= limit <= LIMIT_MAX:
        raise invalid_argument(f"'limit' must be in 1..{LIMIT_MAX}, got {limit}")
    load = arguments.get("load")
    if load is None:
        load = False
    if not isinstance(load, bool):
        raise invalid_argument(f"'load' must be a boolean, got {type(load).__name__}")
    return query, limit, load


def _sync_metadata(source: CatalogSource, index: ToolSearchIndex) -> None:
    """Give the index the metadata of any configured upstream it does not know yet."""
    for name in source.upstream_names():
        if not index.has_server_metadata(name):
            index.set_server_metadata(name, *source.metadata(name))


async def _offered(sign_in_link: SignInLink, origin: Any, needed: SignInNeeded) -> dict[str, str]:
    """The `failed` entry of an upstream that needs a sign-in: with the link, for a client that opens links."""
    entry = _entry(needed.upstream, needed)
    link = await sign_in_link(needed, origin)
    if link is None:
        return entry
    if isinstance(link, str):  # no link for this client now: why (a sign-in under way in another client)
        return entry | {"message": f"{needed.message} ({link})"}
    said = f"sign-in needed: the user can open sign_in_url to sign in to {needed.upstream!r}, then search again"
    return entry | {"message": said, "sign_in_url": link["url"], "elicitation_id": link["elicitation_id"]}


async def load_unloaded(
    source: CatalogSource, sign_in: Callable[[SignInNeeded], Awaitable[dict[str, str]]] | None = None
) -> list[dict[str, str]]:
    """Start, concurrently and once each, every upstream with no catalog, live or snapshot.

    A snapshot already makes an upstream's tools searchable, so it is not
    started for a search. Upstreams inside their backoff window are not started. Returns what could not
    be loaded, sorted by server: `{server, reason, message}`; `sign_in` makes the entry of an upstream
    that needs a sign-in (with the link offered to the calling client).
    """
    failed: list[dict[str, str]] = []
    to_start: list[str] = []
    for name in source.upstream_names():
        if source.store.get(name) is not None:
            continue
        if source.in_backoff(name):
            message = "inside its backoff window after a crash; not started, retry later"
            failed.append({"server": name, "reason": "upstream_unavailable", "message": message})
        else:
            to_start.append(name)

    async def start(name: str) -> None:
        try:
            await source.ensure_catalog(name)
        except SignInNeeded as needed:
            failed.append(await sign_in(needed) if sign_in is not None else _entry(name, needed))
        except Fault as fault:
            failed.append(_entry(name, fault))
        except Exception as exc:  # a bug in one upstream's start must not fail the whole search
            failed.append({"server": name, "reason": "upstream_error", "message": f"{type(exc).__name__}: {exc}"})

    async with anyio.create_task_group() as tg:
        for name in to_start:
            tg.start_soon(start, name)
    return sorted(failed, key=lambda item: item["server"])


def _entry(server: str, fault: Fault) -> dict[str, str]:
    return {"server": server, "reason": fault.reason, "message": fault.message}


def rank(
    source: CatalogSource, index: ToolSearchIndex, query: str, limit: int, *, with_servers: bool
) -> list[dict[str, Any]]:
    """The best `limit` results: tools of loaded catalogs, and with `with_servers` unloaded upstreams."""
    ranked: list[tuple[float, str, str, dict[str, Any]]] = [
        (hit.score, hit.server, hit.tool, tool_result(hit, source.store.get(hit.server)))
        for hit in index.search(query, limit)
    ]
    if with_servers:
        unloaded = [name for name in source.upstream_names() if source.store.get(name) is None]
        ranked += [(hit.score, hit.server, "", server_result(hit)) for hit in index.search_servers(query, unloaded)]
    ranked.sort(key=lambda item: (-item[0], item[1], item[2]))
    return [item[3] for item in ranked[:limit]]


def tool_result(hit: Hit, catalog: Catalog | None = None) -> dict[str, Any]:
    """A tool-level result; one from a snapshot says so (`catalog_loaded: false`, `snapshot_age_s`)."""
    entry = hit.entry
    result = {
        "server": hit.server,
        "tool": hit.tool,
        "title": entry.title,
        "summary": entry.summary,
        "arg_keys": entry.arg_keys,
        "score": round(hit.score, SCORE_DIGITS),
        "catalog_loaded": True,
    }
    return result | snapshot_fields(catalog)


def server_result(hit: ServerHit) -> dict[str, Any]:
    summary = summarize(hit.description)
    if not summary and hit.capabilities:
        summary = "capabilities: " + ", ".join(hit.capabilities)
    return {
        "server": hit.server,
        "tool": None,
        "summary": summary,
        "score": round(hit.score, SCORE_DIGITS),
        "catalog_loaded": False,
        "next": f"catalog_list_tools(server={json.dumps(hit.server)})",
    }


def _payload(items: list[Any], truncated: bool, failed: list[dict[str, str]]) -> dict[str, Any]:
    payload: dict[str, Any] = {"results": items, "truncated": truncated}
    if failed:
        payload["failed"] = failed
    return payload


# ---------------------------------------------------------------- CLI table


def format_results_table(payload: Mapping[str, Any]) -> str:
    """A search result as a ranked text table (for `aggregator search`)."""
    results: Sequence[Mapping[str, Any]] = payload.get("results") or []
    lines: list[str] = []
    if results:
        rows = [_row(rank, item) for rank, item in enumerate(results, 1)]
        lines.append(render_table(("#", "score", "server", "tool", "summary"), rows, right=(0, 1)))
    else:
        lines.append("no matching tools")
    if payload.get("truncated"):
        lines.append("(truncated: more results did not fit max_result_bytes)")
    snapshots = sorted({str(r["server"]) for r in results if r.get("tool") and r.get("catalog_loaded") is False})
    if snapshots:
        lines.append(f"(from catalog snapshots, not started yet: {', '.join(snapshots)})")
    for failure in payload.get("failed") or []:
        lines.append(f"failed to load {failure['server']}: {failure['reason']}: {failure['message']}")
    return "\n".join(lines)


def format_explanation(index: ToolSearchIndex, query: str, payload: Mapping[str, Any]) -> str:
    """Per tool result, which query term matched which field at which tier, and what it added."""
    terms = ", ".join(
        f"{t.token}×{t.weight:g}" + ("" if t.origin == "query" else f" ({t.origin})") for t in index.query_terms(query)
    )
    lines = [f"query terms: {terms}"]
    for rank, item in enumerate(payload.get("results") or [], 1):
        if item.get("tool") is None:
            continue
        matches = index.explain(query, item["server"], item["tool"])
        coverage = f"  (coverage ×{matches[0].coverage:.3f})" if matches and matches[0].coverage != 1.0 else ""
        lines.append(f"#{rank} {item['server']}/{item['tool']}  score {item.get('score')}{coverage}")
        for m in matches:
            if m.origin == "meaning":  # `ToolSearchIndex._explain_meaning`
                lines.append(f"    {'(meaning)':<14} → {m.term} with the request{'':<13} +{m.contribution:.4f}")
                continue
            origin = "" if m.origin == "query" else f"  [{m.origin}]"
            lines.append(
                f"    {m.query_term:<14} → {m.term:<16} {m.tier:<9} in {','.join(m.fields) or '-':<28} "
                f"+{m.contribution:.4f}{origin}"
            )
    return "\n".join(lines)


def _row(rank: int, item: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    score = item.get("score")
    score_text = f"{score:.4f}" if isinstance(score, int | float) else ""
    summary = _clip(item.get("summary") or "", SUMMARY_COLUMN)
    if item.get("tool") is None:
        tool = "(not loaded)"
        hint = f"→ {item.get('next', '')}"
        summary = f"{summary} {hint}" if summary else hint
    else:
        tool = str(item["tool"])
    return (str(rank), score_text, str(item.get("server", "")), tool, summary)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
