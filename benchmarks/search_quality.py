"""Search quality of `catalog_search_tools` against plain BM25 on tool-retrieval datasets.

    .venv/bin/python benchmarks/search_quality.py [DATASET.json ...] [--json] [--max-queries N] [--dense]

Default datasets: every `*.json` in `../shared/data/toolsearch/` (schema and gold
rule in `../shared/data/README.md`). Every query is ranked by our index and by
BM25 (bm25s, k1=1.2, b=0.75, Lucene idf) over the same documents: server id +
title + tool name + description + parameter names and descriptions, split on
camelCase/snake_case/kebab-case and lower-cased. Both rankings are cut to the top
100 (metrics only look at the first hit, the top 5 and the top 10). A document
with score 0 is not retrieved, in either ranking; ties break on (server, tool) in
both.

Metrics over the queries that have at least one gold item: MRR (reciprocal rank
of the first retrieved gold item), recall@k (share of a query's gold items in
the top k), hit@5 (at least one gold item in the top 5). *Strict*: a retrieved
`(server, tool)` matches a gold item when `tool == gold.tool` and `server in
gold.servers`. *Lenient*: it also matches when it is one of the gold item's
`alternatives` (equivalent tools, e.g. ETOM levels 2 and 4). The macro average
is the unweighted mean over the datasets.

`--dense` adds two references (`dense_reference.py`): a sentence-embedding
retriever (all-MiniLM-L6-v2) and the reciprocal-rank fusion of ours with it
(hybrid, k = 60). They need the optional `dense` extra; without it the run says
so on stderr and goes on without those columns.

`--max-queries N` ranks a fixed-seed sample of N queries per dataset, for quick
tuning loops only; reported figures are on all queries.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.catalog.model import catalog_of_wire_tools
from aggregator.catalog.search import DEFAULT_PARAMS, RankingParams, ToolSearchIndex
from aggregator.catalog.store import CatalogStore

DATA_DIR = (Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "toolsearch").resolve()
Pair = tuple[str, str]
METRICS = ("mrr", "recall@1", "recall@5", "recall@10", "hit@5")
DEPTH = 100  # ranks looked at per query
SAMPLE_SEED = 20261123
REFERENCES = ("bm25", "dense", "hybrid")  # rankers besides ours, each optional in a result


@dataclass(frozen=True, slots=True)
class Gold:
    tool: str
    servers: frozenset[str]
    alternatives: frozenset[Pair]  # (server, tool) pairs that count under the lenient rule

    def matches(self, pair: Pair, lenient: bool) -> bool:
        server, tool = pair
        return (tool == self.tool and server in self.servers) or (lenient and pair in self.alternatives)


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    gold: tuple[Gold, ...]


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    servers: list[dict[str, Any]]
    queries: list[Query]


@cache
def load_dataset(path: Path) -> Dataset:
    """A dataset file, parsed once per run."""
    data = json.loads(path.read_text(encoding="utf-8"))
    queries = [
        Query(
            q["query"],
            tuple(
                Gold(
                    g["tool"],
                    frozenset(g["servers"]),
                    frozenset((a["server"], a["tool"]) for a in g.get("alternatives") or ()),
                )
                for g in q["gold"]
            ),
        )
        for q in data["queries"]
        if q["gold"]
    ]
    return Dataset(data.get("dataset", path.stem), data["servers"], queries)


def sample(queries: list[Query], max_queries: int | None) -> list[Query]:
    """All queries, or a fixed-seed sample of `max_queries` of them (in their original order)."""
    if max_queries is None or max_queries >= len(queries):
        return queries
    keep = sorted(random.Random(SAMPLE_SEED).sample(range(len(queries)), max_queries))
    return [queries[i] for i in keep]


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
        store.put(catalog_of_wire_tools(server["id"], server["tools"]))
    return index


def rank_ours(index: ToolSearchIndex, text: str) -> list[Pair]:
    return [(h.server, h.tool) for h in index.search(text, DEPTH)]


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
        top = np.argpartition(-scores, DEPTH)[:DEPTH] if len(scores) > DEPTH else np.arange(len(scores))
        top = top[np.lexsort((top, -scores[top]))]  # score desc, then (server, tool)
        return [self.pairs[i] for i in top if scores[i] > 0]


@cache
def bm25_rankings(path: Path, max_queries: int | None) -> list[list[Pair]]:
    """BM25's ranking of every (sampled) query of a dataset, computed once per run."""
    dataset = load_dataset(path)
    bm25 = Bm25Ranker(dataset.servers)
    return [bm25.rank(q.text) for q in sample(dataset.queries, max_queries)]


# ---------------------------------------------------------------- metrics


def _gold_rank(ranked: Sequence[Pair], gold: Gold, lenient: bool) -> int | None:
    for rank, pair in enumerate(ranked, 1):
        if gold.matches(pair, lenient):
            return rank
    return None


def evaluate(rankings: Iterable[tuple[Query, Sequence[Pair]]], lenient: bool = False) -> dict[str, float]:
    totals = dict.fromkeys(METRICS, 0.0)
    count = 0
    for query, ranked in rankings:
        count += 1
        ranks = [_gold_rank(ranked, gold, lenient) for gold in query.gold]
        found = [r for r in ranks if r is not None]
        totals["mrr"] += 1.0 / min(found) if found else 0.0
        for k in (1, 5, 10):
            totals[f"recall@{k}"] += sum(1 for r in found if r <= k) / len(ranks)
        totals["hit@5"] += 1.0 if any(r <= 5 for r in found) else 0.0
    return {name: round(value / max(count, 1), 4) for name, value in totals.items()}


def run_dataset(
    path: Path,
    params: RankingParams = DEFAULT_PARAMS,
    with_bm25: bool = True,
    max_queries: int | None = None,
    dense: bool = False,
) -> dict[str, Any]:
    """Strict metrics per ranker ("ours", "bm25", with `dense` also "dense" and "hybrid"), lenient
    ones under "lenient"."""
    dataset = load_dataset(path)
    queries = sample(dataset.queries, max_queries)
    index = build_index(dataset.servers, params)
    ours = [rank_ours(index, q.text) for q in queries]
    result: dict[str, Any] = {"dataset": dataset.name, "queries": len(queries)}
    result["ours"] = evaluate(zip(queries, ours, strict=True))
    result["lenient"] = {"ours": evaluate(zip(queries, ours, strict=True), lenient=True)}
    if with_bm25:
        bm25 = bm25_rankings(path, max_queries)
        result["bm25"] = evaluate(zip(queries, bm25, strict=True))
        result["lenient"]["bm25"] = evaluate(zip(queries, bm25, strict=True), lenient=True)
    if dense:
        from dense_reference import DenseRanker, fuse

        neural = DenseRanker(dataset.servers).rank_all([q.text for q in queries], DEPTH)
        hybrid = [fuse(a, b, DEPTH) for a, b in zip(ours, neural, strict=True)]
        for name, rankings in (("dense", neural), ("hybrid", hybrid)):
            result[name] = evaluate(zip(queries, rankings, strict=True))
            result["lenient"][name] = evaluate(zip(queries, rankings, strict=True), lenient=True)
    return result


def target_ratio(ours: float, bm25: float) -> float:
    """How far `ours` is along to the issue's bar: ≥ 1.0 meets it.

    The bar is the lower of MRR ≥ 1.05 × BM25's and error rate (1 − MRR) ≤ 0.8 × BM25's.
    """
    bar = min(1.05 * bm25, 1 - 0.8 * (1 - bm25))
    return ours / bar if bar > 0 else 1.0


def macro(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The unweighted mean of every metric over the datasets, strict and lenient."""

    def mean(get: Any) -> dict[str, float]:
        return {m: round(sum(get(r)[m] for r in results) / len(results), 4) for m in METRICS}

    out: dict[str, Any] = {"dataset": "macro", "queries": sum(r["queries"] for r in results)}
    out["ours"] = mean(lambda r: r["ours"])
    out["lenient"] = {"ours": mean(lambda r: r["lenient"]["ours"])}
    for ranker in REFERENCES:
        if all(ranker in r for r in results):
            out[ranker] = mean(lambda r, ranker=ranker: r[ranker])
            out["lenient"][ranker] = mean(lambda r, ranker=ranker: r["lenient"][ranker])
    return out


def _table(results: list[dict[str, Any]]) -> str:
    head = f"{'dataset':<16} {'rule':<8} {'ranker':<6} {'queries':>7} " + " ".join(f"{m:>9}" for m in METRICS)
    head += f" {'MRR/BM25':>9} {'vs bar':>7}"
    lines = [head, "-" * len(head)]
    for res in results:
        for rule in ("strict", "lenient"):
            scores = res if rule == "strict" else res["lenient"]
            for ranker in ("ours", *REFERENCES):
                if ranker not in scores:
                    continue
                values = " ".join(f"{scores[ranker][m]:>9.4f}" for m in METRICS)
                line = f"{res['dataset']:<16} {rule:<8} {ranker:<6} {res['queries']:>7} {values}"
                if ranker == "ours" and "bm25" in scores:
                    ours, bm25 = scores["ours"]["mrr"], scores["bm25"]["mrr"]
                    line += f" {ours / bm25 if bm25 else 0:>9.3f} {target_ratio(ours, bm25):>7.3f}"
                lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "datasets", nargs="*", type=Path, help="dataset files (default: ../shared/data/toolsearch/*.json)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per dataset, then the macro average")
    parser.add_argument("--max-queries", type=int, help="rank a fixed-seed sample of N queries per dataset (tuning)")
    parser.add_argument("--dense", action="store_true", help="add the dense and hybrid references (the dense extra)")
    args = parser.parse_args(argv)
    if args.dense:
        from dense_reference import available

        if (missing := available()) is not None:
            print(missing, file=sys.stderr)
            args.dense = False
    paths = [p.resolve() for p in args.datasets] or sorted(DATA_DIR.glob("*.json"))
    if not paths:
        print(f"no datasets in {DATA_DIR}", file=sys.stderr)
        return 2
    results = []
    for path in paths:
        res = run_dataset(path, max_queries=args.max_queries, dense=args.dense)
        results.append(res)
        if args.json:
            print(json.dumps(res), flush=True)
    summary = macro(results)
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(_table([*results, summary]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
