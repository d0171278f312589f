"""Search quality on everyday requests over the eight real servers (issue 23).

    .venv/bin/python benchmarks/everyday_quality.py [--split dev|held|blind|blind-N] [--dense] [--misses] [--json]

The requests are `benchmarks/everyday_requests.json`: what a person would type to
Claude Desktop or Code with the official servers connected (time, fetch,
filesystem, git, memory, sqlite, sequential thinking, everything), each with
every tool that would do. The servers are built from their real `tools/list`
results in `../shared/data/catalogs/` (no operator descriptions, as in a
typical config). The requests are split in two halves by a fixed rule (the
file's `about`): tune on "dev", report "held" before and after. A third set,
"blind" (`benchmarks/everyday_requests_blind.json`), was written by two more
writers who read only the catalogs ("blind-2", "blind-3": each alone): never
tuned on, it shows whether changes chosen on one writer's words carry to others'.

Rankers: ours, plain BM25 (`search_quality.py`'s), and with `--dense` the dense
retriever (all-MiniLM-L6-v2) and the reciprocal-rank fusion of ours with it
(`dense_reference.py`; skipped with a message when the `dense` extra is
missing). Metrics per half and ranker, strict: MRR, hit@3, hit@5. `--misses`
prints, for ours, each request whose right tool is not first, with its rank and
our first result (only for the halves asked for: use it on "dev").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from search_quality import DEPTH, Bm25Ranker, Gold, Pair, Query, _gold_rank, build_index, rank_ours

REQUESTS = Path(__file__).resolve().parent / "everyday_requests.json"
BLIND = Path(__file__).resolve().parent / "everyday_requests_blind.json"
CATALOG_DIR = (Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "catalogs").resolve()
SPLITS = ("dev", "held")
SETS = (*SPLITS, "blind")
METRICS = ("mrr", "hit@3", "hit@5")


def split_of(queries: Sequence[str]) -> dict[str, str]:
    """The file's rule: ordered by the SHA-256 of their text, even positions "dev", odd "held"."""
    order = sorted(queries, key=lambda q: hashlib.sha256(q.encode("utf-8")).hexdigest())
    return {q: SPLITS[i % 2] for i, q in enumerate(order)}


def load_requests(path: Path = REQUESTS, blind: Path = BLIND) -> tuple[dict[str, str], dict[str, list[Query]]]:
    """The catalogs' files by server, and the requests of each half (checked against the split rule)
    and of the blind set."""
    data = json.loads(path.read_text(encoding="utf-8"))
    rule = split_of([r["query"] for r in data["requests"]])
    halves: dict[str, list[Query]] = {name: [] for name in SETS}  # and "blind-N": writer N's blind requests
    for request in data["requests"]:
        text, half = request["query"], request["split"]
        if rule[text] != half:
            raise ValueError(f"{text!r} is marked {half!r}, the rule says {rule[text]!r}")
        halves[half].append(_query(text, request["gold"]))
    for request in json.loads(blind.read_text(encoding="utf-8"))["requests"]:
        query = _query(request["query"], request["gold"])
        halves["blind"].append(query)
        halves.setdefault(f"blind-{request['writer']}", []).append(query)  # each writer's alone
    return data["catalogs"], halves


def _query(text: str, gold: list[str]) -> Query:
    pairs = (item.split("/", 1) for item in gold)
    return Query(text, tuple(Gold(tool, frozenset({server}), frozenset()) for server, tool in pairs))


def load_servers(catalogs: dict[str, str], directory: Path = CATALOG_DIR) -> list[dict[str, Any]] | None:
    """The servers as `search_quality` builds them, from their `tools/list` files; None when absent."""
    paths = {server: directory / name for server, name in sorted(catalogs.items())}
    if not all(path.is_file() for path in paths.values()):
        return None
    return [{"id": s, "tools": json.loads(path.read_text(encoding="utf-8"))["tools"]} for s, path in paths.items()]


def best_rank(query: Query, ranked: Sequence[Pair]) -> int | None:
    """The rank of the first right tool in `ranked`, or None."""
    found = [r for g in query.gold if (r := _gold_rank(ranked, g, False)) is not None]
    return min(found) if found else None


def scores(queries: Sequence[Query], rankings: Sequence[Sequence[Pair]]) -> dict[str, float]:
    """Strict MRR, hit@3 and hit@5 of one ranker over one half."""
    ranks = [best_rank(q, ranked) for q, ranked in zip(queries, rankings, strict=True)]
    n = max(len(ranks), 1)
    return {
        "mrr": round(sum(1 / r for r in ranks if r) / n, 4),
        "hit@3": round(sum(1 for r in ranks if r and r <= 3) / n, 4),
        "hit@5": round(sum(1 for r in ranks if r and r <= 5) / n, 4),
    }


def rankers(servers: list[dict[str, Any]], dense: bool) -> dict[str, Callable[[list[str]], list[list[Pair]]]]:
    """Each ranker as texts → rankings: ours, BM25, and with `dense` the dense and hybrid references."""
    index = build_index(servers)
    bm25 = Bm25Ranker(servers)
    out: dict[str, Callable[[list[str]], list[list[Pair]]]] = {
        "ours": lambda texts: [rank_ours(index, t) for t in texts],
        "bm25": lambda texts: [bm25.rank(t) for t in texts],
    }
    if dense:
        from dense_reference import DenseRanker, fuse

        neural = DenseRanker(servers)
        out["dense"] = lambda texts: neural.rank_all(texts, DEPTH)
        out["hybrid"] = lambda texts: [
            fuse(a, b, DEPTH) for a, b in zip(out["ours"](texts), out["dense"](texts), strict=True)
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--split", action="append", help="dev, held, blind or blind-N (writer N alone); default: the first three"
    )
    parser.add_argument("--dense", action="store_true", help="add the dense and hybrid references (the dense extra)")
    parser.add_argument("--misses", action="store_true", help="list the requests ours does not rank first")
    parser.add_argument("--json", action="store_true", help="one JSON object per half and ranker")
    args = parser.parse_args(argv)
    catalogs, halves = load_requests()
    if unknown := set(args.split or ()) - halves.keys():
        parser.error(f"no such set: {', '.join(sorted(unknown))} (sets: {', '.join(sorted(halves))})")
    servers = load_servers(catalogs)
    if servers is None:
        print(f"skipped: the real catalogs are not in {CATALOG_DIR}", file=sys.stderr)
        return 0
    if args.dense:
        from dense_reference import available

        if (missing := available()) is not None:
            print(missing, file=sys.stderr)
            args.dense = False
    ranking = rankers(servers, args.dense)
    print(f"{'half':<5} {'ranker':<7} {'requests':>8} " + " ".join(f"{m:>6}" for m in METRICS), flush=True)
    for half in args.split or SETS:
        queries = halves[half]
        texts = [q.text for q in queries]
        for name, rank in ranking.items():
            rankings = rank(texts)
            result = scores(queries, rankings)
            if args.json:
                print(json.dumps({"half": half, "ranker": name, "requests": len(queries), **result}))
            else:
                print(f"{half:<5} {name:<7} {len(queries):>8} " + " ".join(f"{result[m]:>6.4f}" for m in METRICS))
            if args.misses and name == "ours":
                for query, ranked in zip(queries, rankings, strict=True):
                    if (rank_of := best_rank(query, ranked)) != 1:
                        first = "/".join(ranked[0]) if ranked else "-"
                        print(f"    {rank_of or '-':>3}  {query.text!r}  first {first}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
