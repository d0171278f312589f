"""Latency of apropos-search and who-references over a 10,000-entry catalog.

Run by hand: `.venv/bin/python benchmarks/introspection_bench.py [--entries N] [--packages P]`.
Builds P loaded upstreams (default 100) holding N entries in all (default 10,000:
70% tools with nested input schemas, 10% each prompts, resources, resource
templates, 5% of them hidden), then times each tool through its handler:
the first call after a catalog change (the symbol table and, for
who-references, the parameter index are built) and repeated calls (p50/p99).
The target is a p50 under 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Mapping
from typing import Any

from aggregator.catalog.model import (
    Catalog,
    clean_prompt,
    clean_resource,
    clean_resource_template,
    clean_tool,
    sorted_unique,
)
from aggregator.catalog.store import CatalogStore
from aggregator.tools.base import OwnTool, ToolContext
from aggregator.tools.introspection import introspection_tools

VERBS = [
    "get",
    "list",
    "create",
    "update",
    "delete",
    "search",
    "read",
    "write",
    "sync",
    "export",
    "import",
    "run",
]
NOUNS = [
    "user",
    "issue",
    "file",
    "commit",
    "branch",
    "page",
    "table",
    "row",
    "event",
    "invoice",
    "ticket",
    "job",
]
PARAMS = [
    "repo",
    "path",
    "id",
    "query",
    "limit",
    "offset",
    "name",
    "owner",
    "branch",
    "format",
    "since",
    "tags",
]


class Source:
    """An in-memory CatalogSource: every upstream already loaded."""

    def __init__(self, catalogs: Mapping[str, Catalog]) -> None:
        self._store = CatalogStore()
        for catalog in catalogs.values():
            self._store.put(catalog)
        self._names = sorted(catalogs)

    @property
    def store(self) -> CatalogStore:
        return self._store

    def upstream_names(self) -> list[str]:
        return list(self._names)

    def resolve(self, name: str) -> str | None:
        return next((n for n in self._names if n.casefold() == name.casefold()), None)

    def metadata(self, name: str) -> tuple[str, list[str]]:
        return ("", [])

    def in_backoff(self, name: str) -> bool:
        return False

    async def ensure_catalog(self, name: str) -> Catalog:
        catalog = self._store.get(name)
        assert catalog is not None
        return catalog


def schema(rng: random.Random) -> dict[str, Any]:
    props: dict[str, Any] = {p: {"type": "string"} for p in rng.sample(PARAMS, rng.randint(2, 6))}
    if rng.random() < 0.3:
        element = {"type": "object", "properties": {"path": {}, "mode": {}}}
        props["items"] = {"type": "array", "items": element}
    result: dict[str, Any] = {"type": "object", "properties": props}
    if rng.random() < 0.1:
        result["$defs"] = {"Filter": {"type": "object", "properties": {"field": {}, "value": {}}}}
        result["anyOf"] = [{"properties": {"since": {}}}, {"properties": {"until": {}}}]
    return result


def build_catalog(server: str, entries: int, rng: random.Random) -> Catalog:
    counts = {"tool": entries * 7 // 10, "prompt": entries // 10, "resource": entries // 10}
    counts["template"] = entries - sum(counts.values())

    def name(i: int) -> str:
        return f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}_{i}"

    def hidden() -> bool:
        return rng.random() < 0.05

    tools = [
        clean_tool(server, {"name": name(i), "description": "d", "inputSchema": schema(rng)}, hidden=hidden())
        for i in range(counts["tool"])
    ]
    prompts = [
        clean_prompt(server, {"name": name(i), "arguments": [{"name": p} for p in rng.sample(PARAMS, 2)]})
        for i in range(counts["prompt"])
    ]
    resources = [
        clean_resource(server, {"name": name(i), "uri": f"res://{server}/{i}"}, hidden=hidden())
        for i in range(counts["resource"])
    ]
    templates = [
        clean_resource_template(server, {"name": name(i), "uriTemplate": f"res://{server}/{{repo}}/{{id}}/{i}"})
        for i in range(counts["template"])
    ]
    return Catalog(
        server,
        sorted_unique(tools),
        sorted_unique(prompts),
        sorted_unique(resources),
        sorted_unique(templates),
    )


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(tool: OwnTool, arguments: dict[str, Any]) -> tuple[float, str]:
    start = time.perf_counter()
    result = await tool.handler(arguments, ToolContext())
    elapsed = (time.perf_counter() - start) * 1000
    text = result.content[0].text  # type: ignore[union-attr]
    return elapsed, text


async def bench(entries: int, packages: int, repeats: int) -> None:
    rng = random.Random(0)
    names = [f"srv{i:03d}" for i in range(packages)]
    catalogs = {name: build_catalog(name, entries // packages, rng) for name in names}
    source = Source(catalogs)
    own: list[OwnTool] = []
    own.extend(introspection_tools(source, lambda: own))
    apropos, who = own[0], own[1]
    total = sum(len(c.tools) + len(c.prompts) + len(c.resources) for c in catalogs.values())
    total += sum(len(c.resource_templates) for c in catalogs.values())
    print(f"{total} entries in {packages} packages, {repeats} repeats per case")

    cold, _ = await timed(apropos, {"pattern": "warm"})
    cold_refs, _ = await timed(who, {"name": "repo"})
    print(f"first call after a catalog change: apropos {cold:.1f} ms (symbol table)")
    print(f"first who-references after it: {cold_refs:.1f} ms (parameter index)")

    cases: list[tuple[OwnTool, dict[str, Any]]] = [
        (apropos, {"pattern": "invoice_7"}),
        (apropos, {"pattern": "get_"}),
        (apropos, {"pattern": "zzz-nothing"}),
        (apropos, {"pattern": "", "type": "prompt"}),
        (apropos, {"pattern": "issue", "package": "srv042"}),
        (apropos, {"pattern": ""}),
        (who, {"name": "until"}),
        (who, {"name": "mode", "package": "srv042"}),
        (who, {"name": "REPO"}),
        (who, {"name": "nothing"}),
    ]
    print(f"{'tool':<15} {'arguments':<42} {'lines':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for tool, arguments in cases:
        samples = []
        text = ""
        for _ in range(repeats):
            elapsed, text = await timed(tool, arguments)
            samples.append(elapsed)
        lines = text.count("\n") + 1
        args = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
        p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
        print(f"{tool.name:<15} {args:<42} {lines:>6} {p50:>8.3f} {p99:>8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--packages", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(bench(args.entries, args.packages, args.repeats))


if __name__ == "__main__":
    main()
