"""Speed and memory of the tool search index at scale.

    .venv/bin/python benchmarks/search_speed.py [--servers 500] [--tools 10000] [--queries 200] [--json]
        [--without-meaning]

The catalog is built from the real catalogs in `../shared/data/` (the MCP
servers' `tools/list` dumps and the tool-search datasets' servers): server i
copies base server i mod B, takes its tools and fills up with tools of the
other base servers until it has its share, and gets a varied name (`<base>-<n>`);
tool names get a variant suffix, so every (server, tool) is distinct and the
vocabulary grows as it would with many similar upstreams.

Prints: index build time (catalogs put into a store the index is attached to),
documents and vocabulary, memory held by the index (tracemalloc), and search
latency (limit 8) p50/p99 for queries of 1 to 8 words: runs of consecutive words
of the datasets' real queries, picked with a fixed seed. Latency is wall time and
CPU time of the searching thread (on a shared machine the CPU time is the steadier
figure); "warm" keeps the index's per-token caches between queries, as a running
server does, "cold" clears them before each query, as after a catalog change.
Target: p50 under 2 ms, p99 under 10 ms. `--without-meaning` measures the ranking by words alone
(no re-rank by meaning, `meaning.py`): run both back to back to see what the re-rank costs.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import statistics
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

from aggregator.catalog.model import Catalog, MalformedEntry, ToolEntry, clean_tool, sorted_unique
from aggregator.catalog.search import DEFAULT_PARAMS, RankingParams, ToolSearchIndex
from aggregator.catalog.store import CatalogStore

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
VARIANTS = ("", "v2", "pro", "lite", "plus", "next", "beta", "cloud", "local", "ext", "alt", "max")


def base_servers() -> list[dict[str, Any]]:
    """Every real server: the catalogs' dumps and the datasets' servers, in a fixed order, ids made unique."""
    servers: list[dict[str, Any]] = []
    seen: set[str] = set()
    for path in sorted((DATA / "catalogs").glob("*.json")):
        if path.name != "INDEX.json":
            raw = json.loads(path.read_text(encoding="utf-8"))
            servers.append({"id": path.stem, "description": "", "tools": raw.get("tools", [])})
    for path in sorted((DATA / "toolsearch").glob("*.json")):
        for server in json.loads(path.read_text(encoding="utf-8"))["servers"]:
            servers.append(
                {"id": server["id"], "description": server.get("description") or "", "tools": server["tools"]}
            )
    for server in servers:
        while server["id"] in seen:
            server["id"] += "-b"
        seen.add(server["id"])
    return servers


def build_catalogs(n_servers: int, n_tools: int) -> tuple[list[Catalog], dict[str, str]]:
    """`n_servers` catalogs holding `n_tools` tools in all, and each server's description."""
    bases = base_servers()
    pool = [tool for server in bases for tool in server["tools"]]
    catalogs: list[Catalog] = []
    descriptions: dict[str, str] = {}
    cursor = 0
    for i in range(n_servers):
        base = bases[i % len(bases)]
        round_ = i // len(bases)
        name = re.sub(r"[^A-Za-z0-9_-]", "-", base["id"]) + (f"-{round_}" if round_ else "")
        share = n_tools // n_servers + (1 if i < n_tools % n_servers else 0)
        raws = list(base["tools"][:share])
        while len(raws) < share:
            raws.append(pool[cursor % len(pool)])
            cursor += 1
        entries: dict[str, ToolEntry] = {}
        for j, raw in enumerate(raws):
            variant = VARIANTS[(round_ + j // max(1, len(base["tools"]))) % len(VARIANTS)]
            renamed = dict(raw, name=f"{raw['name']}_{variant}" if variant else raw["name"])
            while renamed["name"] in entries:
                renamed["name"] += "_x"
            try:
                entries[renamed["name"]] = clean_tool(name, renamed)
            except MalformedEntry:
                continue
        catalogs.append(Catalog(server=name, tools=sorted_unique(entries.values())))
        descriptions[name] = base["description"]
    return catalogs, descriptions


def build_index(
    catalogs: list[Catalog], descriptions: dict[str, str], params: RankingParams = DEFAULT_PARAMS
) -> ToolSearchIndex:
    """An index attached to a store, then every catalog put into the store, as the server does."""
    store = CatalogStore()
    index = ToolSearchIndex(params)
    index.attach(store)
    for catalog in catalogs:
        index.set_server_metadata(catalog.server, descriptions[catalog.server], [])
        store.put(catalog)
    return index


def index_memory(
    catalogs: list[Catalog], descriptions: dict[str, str], queries: list[str], params: RankingParams
) -> tuple[int, int]:
    """Bytes held by the index (tracemalloc): once built, and after running `queries` (its caches filled).

    The catalogs themselves are built beforehand and not counted: the index only
    refers to their entries.
    """
    gc.collect()
    tracemalloc.start()
    index = build_index(catalogs, descriptions, params)
    gc.collect()
    built = tracemalloc.get_traced_memory()[0]
    for query in queries:
        index.search(query, 8)
    gc.collect()
    warm = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del index
    return built, warm


def sample_queries(rng: random.Random, n_words: int, count: int) -> list[str]:
    """`count` runs of `n_words` consecutive words from the datasets' real queries."""
    texts: list[list[str]] = []
    for path in sorted((DATA / "toolsearch").glob("*.json")):
        for query in json.loads(path.read_text(encoding="utf-8"))["queries"]:
            words = query["query"].split()
            if len(words) >= n_words:
                texts.append(words)
    queries = []
    for _ in range(count):
        words = rng.choice(texts)
        start = rng.randrange(len(words) - n_words + 1)
        queries.append(" ".join(words[start : start + n_words]))
    return queries


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(index: ToolSearchIndex, queries: list[str], *, cold: bool) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of each search."""
    wall, cpu = [], []
    for query in queries:
        if cold:
            index.clear_cache()
        start, start_cpu = time.perf_counter(), time.thread_time()
        index.search(query, 8)
        cpu.append((time.thread_time() - start_cpu) * 1000)
        wall.append((time.perf_counter() - start) * 1000)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--tools", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=200, help="queries per word count")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--without-meaning", action="store_true", help="the ranking by words alone")
    args = parser.parse_args(argv)
    params = replace(DEFAULT_PARAMS, meaning=0.0) if args.without_meaning else DEFAULT_PARAMS

    catalogs, descriptions = build_catalogs(args.servers, args.tools)
    start = time.perf_counter()
    index = build_index(catalogs, descriptions, params)
    build_s = time.perf_counter() - start
    rng = random.Random(20240611)
    workload = {n: sample_queries(rng, n, args.queries) for n in range(1, 9)}
    memory, memory_warm = index_memory(catalogs, descriptions, [q for qs in workload.values() for q in qs], params)

    report: dict[str, Any] = {
        "servers": len(catalogs),
        "tools": sum(len(c.tools) for c in catalogs),
        "documents": index.document_count,
        "vocabulary": index.vocabulary_size,
        "build_s": round(build_s, 3),
        "index_mib": round(memory / 2**20, 1),
        "index_with_caches_mib": round(memory_warm / 2**20, 1),
        "latency_ms": {},
    }
    everything: dict[str, list[float]] = {}
    for n_words, queries in workload.items():
        measure(index, queries, cold=False)  # fills the caches, as earlier queries would
        runs: dict[str, list[float]] = {}
        runs["wall"], runs["cpu"] = measure(index, queries, cold=False)
        runs["cold_wall"], runs["cold_cpu"] = measure(index, queries, cold=True)
        report["latency_ms"][n_words] = _summary(runs)
        for name, values in runs.items():
            everything.setdefault(name, []).extend(values)
    report["latency_ms"]["all"] = _summary(everything)
    print(json.dumps(report) if args.json else _text(report))
    return 0


def _summary(runs: dict[str, list[float]]) -> dict[str, float]:
    summary = {}
    for name, values in runs.items():
        summary[f"{name}_p50"] = round(statistics.median(values), 3)
        summary[f"{name}_p99"] = round(percentile(values, 0.99), 3)
    return summary


def _text(report: dict[str, Any]) -> str:
    columns = (
        "wall_p50",
        "wall_p99",
        "cpu_p50",
        "cpu_p99",
        "cold_wall_p50",
        "cold_wall_p99",
        "cold_cpu_p50",
        "cold_cpu_p99",
    )
    lines = [
        f"catalog: {report['servers']} servers, {report['tools']} tools; index: {report['documents']} documents, "
        f"{report['vocabulary']} tokens",
        f"build: {report['build_s']:.3f} s   memory held by the index: {report['index_mib']} MiB built, "
        f"{report['index_with_caches_mib']} MiB with its caches filled by the query workload",
        "latency of search(query, limit=8) in ms; warm = caches kept, cold = caches cleared before each query",
        "",
        f"{'words':>5} " + " ".join(f"{c:>13}" for c in columns),
    ]
    for n_words, row in report["latency_ms"].items():
        lines.append(f"{n_words!s:>5} " + " ".join(f"{row[c]:>13.3f}" for c in columns))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
