"""Where the dense reference ranks the right tool above ours: the queries, sorted into general classes.

    .venv/bin/python benchmarks/search_misses.py [DATASET.json] [--show N]

Needs the `dense` extra (`dense_reference.py`). For every query where the dense
retriever puts a right tool higher than ours, `--explain` of the right tool and
of our first result decide the class:

- "the right tool shares no word with the request": nothing of it matched (a vocabulary gap);
- "a word in our first result's name decides": the best-scoring query word of our first
  result is in its name and the right tool lacks that word;
- "a word only our first result has decides": the same, from its other fields;
- "a stop word decides";
- "both hold the deciding word; weights decide": the right tool matches that word too.

It prints the count of each class with `--show` examples, and the query words that decide most often.
The classes steer what to try next (docs/search-quality.md); nothing here tunes the ranking.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from dense_reference import DenseRanker, available
from search_quality import DATA_DIR, DEPTH, Query, _gold_rank, build_index, load_dataset, rank_ours

from aggregator.catalog.search import ToolSearchIndex

Pair = tuple[str, str]


def best_rank(ranked: list[Pair], query: Query) -> int:
    return min([r for gold in query.gold if (r := _gold_rank(ranked, gold, False))] or [DEPTH + 1])


def miss_class(index: ToolSearchIndex, query: Query, first: Pair | None) -> tuple[str, str | None]:
    """The class of a query that dense ranks better, and the query word deciding our first result."""
    gold = query.gold[0]
    right = index.explain(query.text, sorted(gold.servers)[0], gold.tool)
    if not any(m.contribution > 0 for m in right):
        return "the right tool shares no word with the request", None
    ours = index.explain(query.text, *first) if first else []
    if not ours:
        return "both hold the deciding word; weights decide", None
    best = max(ours, key=lambda m: m.contribution)
    if best.origin == "stop word":
        return "a stop word decides", best.query_term
    if best.query_term in {m.query_term for m in right if m.contribution > 0}:
        return "both hold the deciding word; weights decide", None
    if {"name", "identifier"} & set(best.fields):
        return "a word in our first result's name decides", best.query_term
    return "a word only our first result has decides", best.query_term


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", nargs="?", type=Path, default=DATA_DIR / "metatool.json")
    parser.add_argument("--show", type=int, default=3, help="examples per class")
    args = parser.parse_args(argv)
    missing = available()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    dataset = load_dataset(args.dataset)
    index = build_index(dataset.servers)
    ours = [rank_ours(index, q.text) for q in dataset.queries]
    dense = DenseRanker(dataset.servers).rank_all([q.text for q in dataset.queries], DEPTH)
    classes: collections.Counter[str] = collections.Counter()
    words: collections.Counter[str] = collections.Counter()
    examples: dict[str, list[str]] = collections.defaultdict(list)
    for query, mine, theirs in zip(dataset.queries, ours, dense, strict=True):
        ours_rank, dense_rank = best_rank(mine, query), best_rank(theirs, query)
        if dense_rank >= ours_rank:
            continue
        name, word = miss_class(index, query, mine[0] if mine else None)
        classes[name] += 1
        words.update([word] if word else [])
        if len(examples[name]) < args.show:
            examples[name].append(f"{query.text[:100]!r}: ours #{ours_rank}, dense #{dense_rank}")
    total = sum(classes.values())
    print(f"{dataset.name}: dense ranks a right tool higher on {total} of {len(dataset.queries)} queries")
    for name, count in classes.most_common():
        print(f"{count:7d} {100 * count / max(total, 1):5.1f} %  {name}")
        for example in examples[name]:
            print(f"{'':16}{example}")
    print("deciding words:", ", ".join(f"{w} {n}" for w, n in words.most_common(30)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
