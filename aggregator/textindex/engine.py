"""The search algorithm both backends share (DESIGN §2.5).

A backend only has to read postings (`PostingsReader`); matching, scoring, ranking
and highlights happen here, in one place, so that `memory` and `sqlite` give the
same documents, the same order and bit-identical scores for the same corpus.

Matching: every `+` term and phrase is required; without them at least one bare
term must occur; any `-` term or excluded phrase removes the document. Score:
Σ over distinct positive query tokens t of tf(t, d) · (ln(N / (df(t) + 1)) + 1),
summed in sorted token order; ranking by (score rounded to 6 decimals desc, doc_id).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from aggregator.textindex.highlight import make_highlights
from aggregator.textindex.query_parser import ParsedQuery, Phrase
from aggregator.textindex.tokenizer import TokenizerConfig

SCORE_DECIMALS = 6


@dataclass(frozen=True, slots=True)
class StoredDocument:
    doc_id: str
    content: str
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SearchHit:
    doc_id: str
    score: float
    highlights: list[str]
    metadata: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "score": self.score,
            "highlights": list(self.highlights),
            "metadata": self.metadata,
        }


@dataclass(frozen=True, slots=True)
class SearchOutcome:
    hits: list[SearchHit]
    total_matches: int


@dataclass(frozen=True, slots=True)
class AddOutcome:
    status: Literal["indexed", "re-indexed"]
    doc_id: str
    token_count: int


class PostingsReader(Protocol):
    """A consistent snapshot of one index, for the duration of one search."""

    def snapshot_doc_count(self) -> int:
        """N, the number of documents in the snapshot."""
        ...

    def frequencies(self, term: str) -> Mapping[str, int]:
        """doc_id -> occurrences of `term`, for every document containing it."""
        ...

    def phrase_docs(self, phrase: Phrase, candidates: set[str]) -> set[str]:
        """The `candidates` (each containing every token of `phrase`) where the phrase occurs."""
        ...

    def documents(self, doc_ids: Sequence[str]) -> Mapping[str, StoredDocument]: ...


class TextIndex(Protocol):
    """One named index; implementations are thread-safe."""

    name: str
    backend: str
    config: TokenizerConfig

    def add(self, doc_id: str, content: str, metadata: Mapping[str, Any]) -> AddOutcome: ...

    def search(self, query: ParsedQuery, k: int) -> SearchOutcome: ...

    def doc_count(self) -> int: ...

    def close(self) -> None: ...


def idf(doc_count: int, df: int) -> float:
    return math.log(doc_count / (df + 1)) + 1.0


def _phrase_docs(
    reader: PostingsReader, phrase: Phrase, freqs: Mapping[str, Mapping[str, int]], within: set[str] | None
) -> set[str]:
    """Documents (from `within`, if given) where the phrase's tokens sit on consecutive runs."""
    postings = sorted((freqs[token] for token in set(phrase.tokens)), key=len)
    candidates = set(postings[0]) if within is None else within & postings[0].keys()
    for posting in postings[1:]:
        candidates &= posting.keys()
    return reader.phrase_docs(phrase, candidates) if candidates else set()


def _matching_docs(reader: PostingsReader, query: ParsedQuery, freqs: Mapping[str, Mapping[str, int]]) -> set[str]:
    required = sorted((freqs[term] for term in query.must), key=len)
    docs: set[str] | None = None
    if required:
        docs = set(required[0])
        for posting in required[1:]:
            docs &= posting.keys()
    if required or query.phrases:
        for phrase in query.phrases:
            docs = _phrase_docs(reader, phrase, freqs, docs)
        assert docs is not None
    else:
        docs = set().union(*(freqs[term].keys() for term in query.terms))
    for term in query.must_not:
        docs -= freqs[term].keys()
    for phrase in query.excluded_phrases:
        if docs:
            docs -= _phrase_docs(reader, phrase, freqs, docs)
    return docs


def _scores(
    query: ParsedQuery, freqs: Mapping[str, Mapping[str, int]], docs: set[str], doc_count: int
) -> dict[str, float]:
    scores = dict.fromkeys(docs, 0.0)
    for term in query.positive:  # sorted: the same summation order in every backend
        posting = freqs[term]
        weight = idf(doc_count, len(posting))
        if len(posting) <= len(scores):
            for doc, tf in posting.items():
                if doc in scores:
                    scores[doc] += tf * weight
        else:
            for doc in scores:
                count = posting.get(doc)
                if count is not None:
                    scores[doc] += count * weight
    return scores


def rank_top(scores: Mapping[str, float], k: int) -> list[tuple[str, float]]:
    """The best `k` by (score rounded to 6 decimals desc, doc_id), rounding only near the cut.

    Rounding never reorders strictly (it is monotonic); it can only create ties, between
    scores less than 1e-6 apart. So only documents within that distance of the k-th best
    raw score can enter the top k: round and order those alone.
    """
    if not scores:
        return []
    floor = heapq.nlargest(k, scores.values())[-1] - 2 * 10.0**-SCORE_DECIMALS  # 2x: float error
    near = [(-round(score, SCORE_DECIMALS), doc) for doc, score in scores.items() if score >= floor]
    return [(doc, -negated) for negated, doc in heapq.nsmallest(k, near)]


@dataclass(frozen=True, slots=True)
class Matches:
    """The top documents of a search and how many matched, before highlighting."""

    top: list[tuple[StoredDocument, float]]
    total: int


def run_search(reader: PostingsReader, query: ParsedQuery, k: int) -> Matches:
    """Match, score and rank `query` over the snapshot `reader` (its lock or transaction held)."""
    if not (query.terms or query.must or query.phrases):
        return Matches([], 0)
    phrase_tokens = {t for p in query.excluded_phrases for t in p.tokens}
    needed = sorted(set(query.positive) | set(query.must_not) | phrase_tokens)
    freqs = {term: reader.frequencies(term) for term in needed}
    docs = _matching_docs(reader, query, freqs)
    if not docs:  # also spares idf() an empty index, where ln(0) has no value
        return Matches([], 0)
    top = rank_top(_scores(query, freqs, docs, reader.snapshot_doc_count()), k)
    stored = reader.documents([doc for doc, _ in top])
    return Matches([(stored[doc], score) for doc, score in top], len(docs))


def with_highlights(matches: Matches, config: TokenizerConfig, query: ParsedQuery) -> SearchOutcome:
    """The hits of `matches`, highlighted: run after the index's lock is released (documents are immutable)."""
    hits = [
        SearchHit(
            doc_id=document.doc_id,
            score=score,
            highlights=make_highlights(document.content, config, query),
            metadata=document.metadata,
        )
        for document, score in matches.top
    ]
    return SearchOutcome(hits, matches.total)
