"""How much a better word table could give: the re-rank by meaning with the model's own sentence vectors.

    .venv/bin/pip install -e ".[bench,dense]"
    .venv/bin/python benchmarks/meaning_ceiling.py [DATASET.json ...] [--max-queries N] [--weights 0.6,1.2]

The search re-ranks its best lexical results by closeness in meaning, with text
vectors summed from a shipped table of word vectors (`aggregator/catalog/search/meaning.py`),
distilled offline from all-MiniLM-L6-v2. This run ranks every dataset of
`search_quality.py` twice per weight, with one change between the two: the text
vectors. "table" is the search as shipped; "model" gives the same re-rank the
embedding all-MiniLM-L6-v2 makes of the same words (`dense_reference.embed`).
Everything else is the product's own code: the same lexical head, the same
formula, the same name floor. The gap between the two columns is the most a
better table (more dimensions, a fitted one, a larger vocabulary) could give at
that weight. The last column is the share of queries whose right tool is among
the best `meaning_head` by words at all: what any re-rank of them is bounded by.
docs/search-quality.md (issue 23, seventh round) reads the figures.

Strict MRR per dataset and weight. Needs the dense extra; a first run embeds
every text the re-rank compares (cached by content under ~/.cache/aggregator-bench/dense/).
"""

from __future__ import annotations

import argparse
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from dense_reference import available, embed
from search_quality import DATA_DIR, build_index, evaluate, load_dataset, rank_ours, sample

import aggregator.catalog.search.index as index_module
from aggregator.catalog.search import DEFAULT_PARAMS
from aggregator.catalog.search.meaning import Vector, WordVectors, word_vectors


class RecordingTable:
    """The shipped table, noting every text it gives a vector of (the model's pass embeds them)."""

    def __init__(self, table: WordVectors) -> None:
        self.table = table
        self.texts: set[str] = set()

    def text_vector(self, words: Iterable[str]) -> Vector | None:
        words = list(words)
        vector = self.table.text_vector(words)
        if vector is not None:
            self.texts.add(" ".join(words))
        return vector


class ModelTable:
    """Text vectors from the model: the unit embedding of the words joined by spaces, for the texts
    the shipped table has a vector of (a text of no known word stays without one, as shipped)."""

    def __init__(self, texts: Sequence[str]) -> None:
        ordered = sorted(texts)
        vectors = embed(ordered)
        self.vectors = {text: array("f", row.tolist()) for text, row in zip(ordered, vectors, strict=True)}

    def text_vector(self, words: Iterable[str]) -> Vector | None:
        return self.vectors.get(" ".join(words))


@contextmanager
def vectors_from(table: RecordingTable | ModelTable) -> Iterator[None]:
    """The search's text vectors come from `table` in this block (the index looks the table up per search)."""
    index_module.word_vectors = lambda: table  # type: ignore[assignment,return-value]
    try:
        yield
    finally:
        index_module.word_vectors = word_vectors


def mrr(dataset_path: Path, weight: float, max_queries: int | None) -> float:
    dataset = load_dataset(dataset_path)
    queries = sample(dataset.queries, max_queries)
    index = build_index(dataset.servers, replace(DEFAULT_PARAMS, meaning=weight))
    return evaluate((q, rank_ours(index, q.text)) for q in queries)["mrr"]


def in_head(dataset_path: Path, max_queries: int | None) -> float:
    """The share of queries with a right tool among the best `meaning_head` by words: the MRR of a
    perfect re-rank, which no vectors can pass."""
    dataset = load_dataset(dataset_path)
    queries = sample(dataset.queries, max_queries)
    index = build_index(dataset.servers, replace(DEFAULT_PARAMS, meaning=0.0))
    head = DEFAULT_PARAMS.meaning_head
    found = 0
    for query in queries:
        best = rank_ours(index, query.text)[:head]
        found += any(gold.matches(pair, False) for pair in best for gold in query.gold)
    return found / max(len(queries), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "datasets", nargs="*", type=Path, help="dataset files (default: ../shared/data/toolsearch/*.json)"
    )
    parser.add_argument("--max-queries", type=int, help="a fixed-seed sample of N queries per dataset")
    parser.add_argument("--weights", default=str(DEFAULT_PARAMS.meaning), help="meaning weights, comma-separated")
    args = parser.parse_args(argv)
    if (missing := available()) is not None:
        print(missing, file=sys.stderr)
        return 2
    table = word_vectors()
    paths = [p.resolve() for p in args.datasets] or sorted(DATA_DIR.glob("*.json"))
    if table is None or not paths:
        print(f"no word table in the package, or no datasets in {DATA_DIR}", file=sys.stderr)
        return 2
    weights = [float(w) for w in args.weights.split(",")]
    columns = "".join(f" {f'table {w:g}':>11} {f'model {w:g}':>11}" for w in weights)
    print(f"{'dataset':<18}{columns} {f'in best {DEFAULT_PARAMS.meaning_head}':>11}")
    for path in paths:
        recording = RecordingTable(table)
        with vectors_from(recording):
            shipped = [mrr(path, w, args.max_queries) for w in weights]
        with vectors_from(ModelTable(sorted(recording.texts))):
            ceiling = [mrr(path, w, args.max_queries) for w in weights]
        name = load_dataset(path).name[:18]
        pairs = "".join(f" {a:>11.4f} {b:>11.4f}" for a, b in zip(shipped, ceiling, strict=True))
        print(f"{name:<18}{pairs} {in_head(path, args.max_queries):>11.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
