"""Speed and size of the full-text search index tools, memory and sqlite side by side.

    .venv/bin/python benchmarks/text_index_bench.py [--docs 10000] [--words 200] [--queries 500]

The corpus is synthetic and seeded: words drawn from a 20,000-word vocabulary with
a Zipf(1.1) distribution, so a few words are in almost every document and most are
rare, as in prose. Every figure is taken through the MCP tool handlers
(`TextSearchTools`, the code `aggregator serve` runs), one call at a time:

- adds per second: `search_add_document` for every document (sqlite: one durable
  transaction per add, `synchronous=FULL`);
- `search_index` latency p50 / p99 (target p50 < 5 ms) over a mix of queries:
  1-3 bare words of every frequency, `+word`, `-word`, a two-word phrase taken from
  a document, and combinations;
- memory held: resident-set growth of the process while the index was built
  (an upper bound: it includes the allocator's slack);
- sqlite file size, after a WAL checkpoint.

Also checks that both backends return identical results for every query.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import os
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

import anyio

from aggregator.tools.base import ToolContext
from aggregator.tools.text_search import TextSearchTools

SEED = 20260728
VOCABULARY = 20_000
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "shi", "den", "por", "qua", "zel", "bri", "th"]


def vocabulary(rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))))
    return sorted(words)


class Corpus:
    def __init__(self, docs: int, words: int) -> None:
        rng = random.Random(SEED)
        self.words = vocabulary(rng)
        rng.shuffle(self.words)  # rank in the Zipf law, unrelated to spelling
        self.cumulative = list(accumulate(1 / (rank + 1) ** 1.1 for rank in range(VOCABULARY)))
        self.rng = rng
        self.docs = {f"doc-{i:05d}": self._text(words) for i in range(docs)}

    def _word(self) -> str:
        pick = self.rng.random() * self.cumulative[-1]
        return self.words[bisect.bisect_left(self.cumulative, pick)]

    def _text(self, words: int) -> str:
        count = self.rng.randint(words * 3 // 4, words * 5 // 4)
        sentences, sentence = [], []
        for _ in range(count):
            sentence.append(self._word())
            if len(sentence) >= self.rng.randint(6, 20):
                sentences.append(" ".join(sentence).capitalize() + ".")
                sentence = []
        sentences.append(" ".join(sentence).capitalize() + ".")
        return " ".join(sentences)

    def queries(self, count: int) -> list[str]:
        rng = random.Random(SEED + 1)
        doc_texts = list(self.docs.values())
        common, rare = self.words[:50], self.words[50:5000]
        makers: list[Callable[[], str]] = [
            lambda: rng.choice(rare),
            lambda: f"{rng.choice(common)} {rng.choice(rare)}",
            lambda: " ".join(rng.choice(self.words[:2000]) for _ in range(3)),
            lambda: f"+{rng.choice(common)} {rng.choice(rare)}",
            lambda: f"{rng.choice(rare)} -{rng.choice(common)}",
            lambda: '"' + " ".join(rng.choice(doc_texts).split()[5:7]).strip(".") + '"',
            lambda: f'+{rng.choice(common)} "{" ".join(rng.choice(doc_texts).split()[10:12]).strip(".")}"',
            lambda: f"{rng.choice(common)} {rng.choice(common)}",  # the worst case: most documents match
        ]
        return [makers[i % len(makers)]() for i in range(count)]


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


async def call(handler: Any, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await handler(arguments, ToolContext())
    assert not result.is_error, result.structured_content
    payload: dict[str, Any] = result.structured_content
    return payload


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


class Bench:
    """Both backends behind one `TextSearchTools`, as `aggregator serve` holds them."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.family = TextSearchTools(data)
        self.tools = {tool.name: tool.handler for tool in self.family.tools()}

    def restart(self) -> None:
        """A new tool family over the same data dir: persistent indexes reopen lazily."""
        self.family.close()
        self.family = TextSearchTools(self.data)
        self.tools = {tool.name: tool.handler for tool in self.family.tools()}

    async def build(self, backend: str, corpus: Corpus) -> dict[str, float]:
        await call(self.tools["search_create_index"], {"index_name": backend, "backend": backend})
        gc.collect()
        rss_before = rss_bytes()
        started = time.perf_counter()
        for doc_id, content in corpus.docs.items():
            arguments = {"doc_id": doc_id, "content": content, "index_name": backend}
            await call(self.tools["search_add_document"], arguments)
        seconds = time.perf_counter() - started
        gc.collect()
        return {"adds_per_s": len(corpus.docs) / seconds, "rss_mib": (rss_bytes() - rss_before) / 2**20}

    async def search(self, backend: str, query: str) -> tuple[float, dict[str, Any]]:
        started = time.perf_counter()
        answer = await call(self.tools["search_index"], {"query": query, "k": 10, "index_name": backend})
        return (time.perf_counter() - started) * 1000, answer

    async def search_pass(self, backends: list[str], queries: list[str]) -> dict[str, Any]:
        """Every query on every backend in turn, so machine noise hits all backends alike."""
        latencies: dict[str, list[float]] = {b: [] for b in backends}
        answers: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
        for query in queries:
            for backend in backends:
                ms, answer = await self.search(backend, query)
                latencies[backend].append(ms)
                answers[backend].append(answer)
        return {"latencies": latencies, "answers": answers}

    def file_mib(self, backend: str) -> float:
        path = self.data / "indexes" / f"{backend}.sqlite3"
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return path.stat().st_size / 2**20


def latency_line(values: list[float]) -> str:
    return f"p50 {statistics.median(values):6.2f} ms, p99 {percentile(values, 0.99):7.2f} ms, max {max(values):7.2f} ms"


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    corpus = Corpus(args.docs, args.words)
    queries = corpus.queries(args.queries)
    words = sum(len(text.split()) for text in corpus.docs.values())
    text_mib = sum(len(text.encode()) for text in corpus.docs.values()) / 2**20
    seconds = time.perf_counter() - started
    per_doc = words / len(corpus.docs)
    print(f"corpus: {len(corpus.docs)} documents of {per_doc:.0f} words on average, ", end="")
    print(f"{text_mib:.1f} MiB of text (generated in {seconds:.1f} s); {len(queries)} queries")
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    backends = list(args.backends)
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp))
        for backend in backends:
            built = await bench.build(backend, corpus)
            print(f"{backend:>6}: {built['adds_per_s']:7.0f} adds/s, memory held {built['rss_mib']:6.1f} MiB")
        if "sqlite" in backends:
            print(f"sqlite: file {bench.file_mib('sqlite'):.1f} MiB")
            bench.restart()  # the memory index is gone: search it again only if rebuilt
            if "memory" in backends:
                await bench.build("memory", corpus)
            rss_before = rss_bytes()
            ms, _ = await bench.search("sqlite", queries[0])
            print(f"sqlite: first search after a restart (opens the file lazily) {ms:.2f} ms")
        passes = [await bench.search_pass(backends, queries) for _ in range(2)]
        for number, result in enumerate(passes, 1):
            for backend in backends:
                print(f"{backend:>6}: search pass {number}: {latency_line(result['latencies'][backend])}")
        if "sqlite" in backends:
            cache_mib = (rss_bytes() - rss_before) / 2**20
            print(f"sqlite: memory held by its read cache after the searches {cache_mib:.1f} MiB")
        answers = passes[0]["answers"]
        matches = statistics.median(a["total_matches"] for a in answers[backends[0]])
        print(f"median total_matches per query: {matches:.0f}")
        bench.family.close()
    if len(backends) == 2:
        same = all(p["answers"]["memory"] == p["answers"]["sqlite"] for p in passes)
        print(f"memory and sqlite results identical for all {len(queries)} queries: {same}")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--words", type=int, default=200)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--backends", nargs="+", default=["memory", "sqlite"], choices=["memory", "sqlite"])
    anyio.run(main, parser.parse_args())
