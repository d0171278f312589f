"""Direct exposure (DESIGN §2.3): upstream tools listed as `<server>__<tool>`.

Names are resolved back through a table, never by splitting strings: a server
or tool name may itself contain `__`, and long names are cut to 64 characters
with a short hash suffix.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp.types as types
from mcp_types.methods import validate_server_result
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from aggregator.catalog.model import Catalog
from aggregator.log import get_logger

log = get_logger(__name__)

MAX_NAME = 64
_INVALID = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class DirectTool:
    exposed: str
    server: str
    tool: str
    wire: types.Tool


def exposed_name(server: str, tool: str) -> str:
    """`server__tool`, made valid for strict clients (`^[a-zA-Z0-9_-]{1,64}$`)."""
    name = f"{server}__{_INVALID.sub('_', tool)}"
    if len(name) <= MAX_NAME and name == f"{server}__{tool}":
        return name
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}_{digest}"


_MODERN_ENVELOPE = {"resultType": "complete", "ttlMs": 0, "cacheScope": "private"}


def check_republishable(wire: Mapping[str, Any]) -> None:
    """Raise ValidationError unless `wire` is a valid tool in every protocol version we serve.

    The server validates a whole `tools/list` result against the client's version: one tool
    it rejects would fail the listing for every tool, ours included.
    """
    for version in KNOWN_PROTOCOL_VERSIONS:
        envelope = _MODERN_ENVELOPE if version in MODERN_PROTOCOL_VERSIONS else {}
        validate_server_result("tools/list", version, {**envelope, "tools": [wire]})


def build_direct_tools(
    catalogs: Mapping[str, Catalog], is_direct: Mapping[str, Any], reserved: Iterable[str]
) -> dict[str, DirectTool]:
    """The exposed-name table for every loaded catalog's directly exposed tools.

    `is_direct[server]` is a predicate `tool_name -> bool` (the upstream's
    `expose: direct` or `pin:` list). Names of the aggregator's own tools are
    `reserved` and never shadowed.
    """
    taken = set(reserved)
    table: dict[str, DirectTool] = {}
    for server in sorted(catalogs):
        predicate = is_direct.get(server)
        if predicate is None:
            continue
        for tool in catalogs[server].exposed_tools:
            if not predicate(tool.name):
                continue
            name = exposed_name(server, tool.name)
            if name in taken:
                log.warning("direct tool name collides; skipped", server=server, tool=tool.name, name=name)
                continue
            wire = dict(tool.wire)
            wire["name"] = name
            if not wire.get("title"):
                wire["title"] = f"{tool.title or tool.name} ({server})"
            try:
                model = types.Tool.model_validate(wire)
                check_republishable(wire)
            except ValidationError as exc:
                log.warning("direct tool not republishable; skipped", server=server, tool=tool.name, error=str(exc))
                continue
            taken.add(name)
            table[name] = DirectTool(name, server, tool.name, model)
    return table
