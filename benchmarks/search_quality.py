"""Search quality of `catalog_search_tools` against plain BM25 on tool-retrieval datasets.

    .venv/bin/python benchmarks/search_quality.py [DATASET.json ...] [--json]

Default datasets: every `*.json` in `../shared/data/toolsearch/` (schema and gold
rule in `../shared/data/README.md`). Every query is ranked by our index (all
matching tools) and by BM25 (bm25s, k1=1.2, b=0.75, Lucene idf) over the same
documents: server id + title + tool name + description + parameter names and
descriptions, split on camelCase/snake_case/kebab-case and lower-cased. A
document with score 0 is not retrieved, in either ranking; ties break on
(server, tool) in both.

Metrics over the queries that have at least one gold item: MRR (reciprocal rank
of the first retrieved gold item), recall@k (share of a query's gold items in
the top k), hit@5 (at least one gold item in the top 5).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.catalog.model import Catalog, MalformedEntry, clean_tool, sorted_unique
from aggregator.catalog.search import DEFAULT_PARAMS, RankingParams, ToolSearchIndex
from aggregator.catalog.store import CatalogStore

DATA_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "toolsearch"
Pair = tuple[str, str]
METRICS = ("mrr", "recall@1", "recall@5", "recall@10", "hit@5")


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    gold: tuple[tuple[str, frozenset[str]], ...]  # (tool, servers that count)


def load_dataset(path: Path) -> tuple[str, list[dict[str, Any]], list[Query]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    queries = [
        Query(q["query"], tuple((g["tool"], frozenset(g["servers"])) for g in q["gold"]))
        for q in data["queries"]
        if q["gold"]
    ]
    return data.get("dataset", path.stem), data["servers"], queries


# ---------------------------------------------------------------- ours


def server_metadata(server: dict[str, Any]) -> tuple[str, list[str]]:
    """The dataset's server description as operator metadata; its title when it says more than the id."""
    title = server.get("title") or ""
    caps = [title] if _plain_tokens(title) != _plain_tokens(server["id"]) else []
    return server.get("description") or "", caps


def build_index(servers: Sequence[dict[str, Any]], params: RankingParams = DEFAULT_PARAMS) -> ToolSearchIndex:
    store = CatalogStore()
    index = ToolSearchIndex(params)
    index.attach(store)
    for server in servers:
        index.set_server_metadata(server["id"], *server_metadata(server))
        tools = []
        for raw in server["tools"]:
            try:
                tools.append(clean_tool(server["id"], raw))
            except MalformedEntry:
                continue
        store.put(Catalog(server=server["id"], tools=sorted_unique(tools)))
    return index


def rank_ours(index: ToolSearchIndex, text: str) -> list[Pair]:
    return [(h.server, h.tool) for h in index.search(text, index.document_count)]


# ---------------------------------------------------------------- BM25

_CAMEL = re.compile(r"[A-Z0-9]+s(?![a-z])|[A-Z0-9]+(?=[A-Z][a-z])|[A-Z0-9]*[a-z0-9]+|[A-Z0-9]+")


def _plain_tokens(text: str) -> list[str]:
    """The reference BM25 tokenization: word runs split on case changes, lower-cased."""
    out: list[str] = []
    for run in re.findall(r"[^\W_]+", text):
        pieces = _CAMEL.findall(run) if run.isascii() else [run]
        out.extend(p.lower() for p in pieces)
    return out


def _bm25_document(server: dict[str, Any], tool: dict[str, Any]) -> list[str]:
    parts = [server["id"], server.get("title") or "", tool["name"], tool.get("description") or ""]
    props = (tool.get("inputSchema") or {}).get("properties") or {}
    for name in sorted(props):
        parts.append(name)
        spec = props[name]
        if isinstance(spec, dict) and isinstance(spec.get("description"), str):
            parts.append(spec["description"])
    return _plain_tokens(" ".join(parts))


class Bm25Ranker:
    def __init__(self, servers: Sequence[dict[str, Any]]) -> None:
        import bm25s

        docs = sorted(((s["id"], t["name"]), _bm25_document(s, t)) for s in servers for t in s["tools"])
        self.pairs: list[Pair] = [pair for pair, _ in docs]
        self.retriever = bm25s.BM25(k1=1.2, b=0.75)
        self.retriever.index([tokens for _, tokens in docs], show_progress=False)

    def rank(self, text: str) -> list[Pair]:
        tokens = [t for t in _plain_tokens(text) if t in self.retriever.vocab_dict]
        if not tokens:
            return []
        scores = self.retriever.get_scores(tokens)
        order = np.lexsort((np.arange(len(scores)), -scores))  # score desc, then (server, tool)
        return [self.pairs[i] for i in order if scores[i] > 0]


# ---------------------------------------------------------------- metrics


def _gold_rank(ranked: Sequence[Pair], tool: str, servers: frozenset[str]) -> int | None:
    for rank, (server, name) in enumerate(ranked, 1):
        if name == tool and server in servers:
            return rank
    return None


def evaluate(rankings: Iterable[tuple[Query, Sequence[Pair]]]) -> dict[str, float]:
    totals = dict.fromkeys(METRICS, 0.0)
    count = 0
    for query, ranked in rankings:
        count += 1
        ranks = [_gold_rank(ranked, tool, servers) for tool, servers in query.gold]
        found = [r for r in ranks if r is not None]
        totals["mrr"] += 1.0 / min(found) if found else 0.0
        for k in (1, 5, 10):
            totals[f"recall@{k}"] += sum(1 for r in found if r <= k) / len(ranks)
        totals["hit@5"] += 1.0 if any(r <= 5 for r in found) else 0.0
    return {name: round(value / max(count, 1), 4) for name, value in totals.items()}


def run_dataset(path: Path, params: RankingParams = DEFAULT_PARAMS, with_bm25: bool = True) -> dict[str, Any]:
    name, servers, queries = load_dataset(path)
    index = build_index(servers, params)
    result: dict[str, Any] = {"dataset": name, "queries": len(queries)}
    result["ours"] = evaluate((q, rank_ours(index, q.text)) for q in queries)
    if with_bm25:
        bm25 = Bm25Ranker(servers)
        result["bm25"] = evaluate((q, bm25.rank(q.text)) for q in queries)
    return result


def _table(results: list[dict[str, Any]]) -> str:
    head = f"{'dataset':<14} {'ranker':<6} {'queries':>7} " + " ".join(f"{m:>9}" for m in METRICS)
    lines = [head, "-" * len(head)]
    for res in results:
        for ranker in ("ours", "bm25"):
            values = " ".join(f"{res[ranker][m]:>9.4f}" for m in METRICS)
            lines.append(f"{res['dataset']:<14} {ranker:<6} {res['queries']:>7} {values}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "datasets", nargs="*", type=Path, help="dataset files (default: ../shared/data/toolsearch/*.json)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per dataset")
    args = parser.parse_args(argv)
    paths = args.datasets or sorted(DATA_DIR.resolve().glob("*.json"))
    if not paths:
        print(f"no datasets in {DATA_DIR.resolve()}", file=sys.stderr)
        return 2
    results = []
    for path in paths:
        res = run_dataset(path)
        results.append(res)
        if args.json:
            print(json.dumps({"dataset": res["dataset"], "ours": res["ours"], "bm25": res["bm25"]}), flush=True)
    if not args.json:
        print(_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
