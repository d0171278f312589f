"""An upstream's catalog as it answers: every page of each list, each entry cleaned.

`list_catalog` runs on the first start and on every re-listing after a
`list_changed`; a malformed entry is dropped with its reason, never the listing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import mcp.types as types
from mcp import ClientSession

from aggregator.catalog.model import (
    Catalog,
    MalformedEntry,
    clean_prompt,
    clean_resource,
    clean_resource_template,
    clean_tool,
    sorted_unique,
)
from aggregator.config import UpstreamConfig
from aggregator.log import get_logger
from aggregator.sdk import raw_request

log = get_logger(__name__)

MAX_PAGES = 1000


async def list_catalog(
    session: ClientSession,
    config: UpstreamConfig,
    server_info: types.Implementation | None,
    instructions: str | None,
    offered: tuple[str, ...],
) -> Catalog:
    """The catalog of the upstream `config` names, listed through `session` and cleaned."""
    caps = session.server_capabilities
    allows = config.tools.allows
    dropped: list[str] = []

    def clean_all(items: list[Any], cleaner: Callable[..., Any], hide: Callable[[str], bool]) -> tuple[Any, ...]:
        kept = []
        for raw in items:
            try:
                name = raw.get("name") if isinstance(raw, Mapping) else None
                kept.append(cleaner(config.name, raw, hidden=hide(name) if isinstance(name, str) else False))
            except Exception as exc:
                reason = str(exc) if isinstance(exc, MalformedEntry) else f"{type(exc).__name__}: {exc}"
                dropped.append(reason)
                log.warning("dropped malformed entry", upstream=config.name, reason=reason)
        return sorted_unique(kept)

    tools = await list_all(session, "tools/list", "tools")
    prompts = await list_all(session, "prompts/list", "prompts") if caps and caps.prompts else []
    resources = await list_all(session, "resources/list", "resources") if caps and caps.resources else []
    templates = (
        await list_all(session, "resources/templates/list", "resourceTemplates") if caps and caps.resources else []
    )
    never = lambda _name: False  # noqa: E731 - allow/deny filters apply to tools only
    return Catalog(
        server=config.name,
        tools=clean_all(tools, clean_tool, lambda n: not allows(n)),
        prompts=clean_all(prompts, clean_prompt, never),
        resources=clean_all(resources, clean_resource, never),
        resource_templates=clean_all(templates, clean_resource_template, never),
        dropped=tuple(dropped),
        server_info=server_info.model_dump(by_alias=True, exclude_none=True) if server_info else None,
        instructions=instructions,
        offered=offered,
    )


async def list_all(session: ClientSession, method: str, key: str) -> list[Any]:
    """Every item of a paginated list; stops on a repeated cursor or after MAX_PAGES."""
    items: list[Any] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(MAX_PAGES):
        result = await raw_request(session, method, {"cursor": cursor} if cursor else None)
        page = result.get(key)
        if isinstance(page, list):
            items.extend(page)
        cursor = result.get("nextCursor")
        if not isinstance(cursor, str) or not cursor or cursor in seen:
            break
        seen.add(cursor)
    return items


def catalog_contents(catalog: Catalog) -> tuple[Any, ...]:
    """What a re-listing compares to decide whether the catalog changed."""
    return (catalog.tools, catalog.prompts, catalog.resources, catalog.resource_templates)
