"""Direct exposure (DESIGN §2.3): upstream tools listed as `<server>__<tool>`, or as `prefix:` says.

Names are resolved back through a table, never by splitting strings: a server
or tool name may itself contain `__`, and long names are cut to 64 characters
with a short hash suffix. An upstream's `prefix:` replaces `<server>__` (a
string) or drops it (`false`); a name two owners claim is a `Clash`: the
first owner (our own tools, then upstreams by name) keeps it.
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
from aggregator.config import AggregatorConfig
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


def exposed_name(server: str, tool: str, prefix: str | None = None) -> str:
    """`<prefix><tool>` (`prefix` None: `<server>__`), made valid for strict clients (`^[a-zA-Z0-9_-]{1,64}$`).

    A cut or cleaned name ends in a hash of (server, tool): distinct per upstream whatever the prefix.
    """
    head = f"{server}__" if prefix is None else prefix
    name = head + _INVALID.sub("_", tool)
    if 0 < len(name) <= MAX_NAME and name == head + tool:
        return name
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}_{digest}"


OWN = "aggregator"  # the owner of the aggregator's own tools


def name_prefixes(config: AggregatorConfig) -> dict[str, str]:
    """Upstream name → what goes before its exposed tool and prompt names."""
    return {name: upstream.name_prefix for name, upstream in config.upstreams.items()}


@dataclass(frozen=True, slots=True)
class Clash:
    """An exposed `name` of `kind` (tool, prompt) claimed by `first` (it keeps it) and by upstream `second`."""

    kind: str
    name: str
    first: str
    second: str

    def message(self) -> str:
        first = "one of the aggregator's own tools" if self.first == OWN else f"upstream {self.first!r}"
        return f"the {self.kind} name {self.name!r} is claimed by {first} and by upstream {self.second!r}"


def claim(taken: dict[str, str], name: str, owner: str, kind: str, clashes: list[Clash] | None) -> bool:
    """Take `name` for `owner` unless another owner has it; a refusal is added to `clashes`."""
    first = taken.setdefault(name, owner)
    if first != owner and clashes is not None:
        clashes.append(Clash(kind, name, first, owner))
    return first == owner


def log_clashes(clashes: list[Clash], seen: set[Clash]) -> None:
    """One error line per clash not reported before (tables are rebuilt on every catalog change)."""
    for clash in clashes:
        if clash not in seen:
            seen.add(clash)
            log.error(
                "name claimed twice; the second owner's entry is not exposed (see prefix:)", problem=clash.message()
            )


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
    catalogs: Mapping[str, Catalog],
    is_direct: Mapping[str, Any],
    reserved: Iterable[str],
    prefixes: Mapping[str, str] | None = None,
    clashes: list[Clash] | None = None,
) -> dict[str, DirectTool]:
    """The exposed-name table for every loaded catalog's directly exposed tools.

    `is_direct[server]` is a predicate `tool_name -> bool` (the upstream's
    `expose: direct` or `pin:` list). Names of the aggregator's own tools are
    `reserved` and never shadowed. `prefixes[server]` replaces `<server>__`;
    names claimed twice go to `clashes`.
    """
    taken = dict.fromkeys(reserved, OWN)
    table: dict[str, DirectTool] = {}
    prefixes = prefixes or {}
    for server in sorted(catalogs):
        predicate = is_direct.get(server)
        if predicate is None:
            continue
        for tool in catalogs[server].exposed_tools:
            if not predicate(tool.name):
                continue
            name = exposed_name(server, tool.name, prefixes.get(server))
            if name in taken and taken[name] != server:
                claim(taken, name, server, "tool", clashes)
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
            claim(taken, name, server, "tool", clashes)
            table[name] = DirectTool(name, server, tool.name, model)
    return table
