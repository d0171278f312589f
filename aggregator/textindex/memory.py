"""The in-process backend.

Two structures, chosen for memory and speed: per term, a dict doc_id -> tf (small
ints are shared objects, so a posting costs one dict slot); per document, its runs
encoded as 4-byte term ids (0 for a run `min_length` drops). A phrase is then a
byte pattern, found with C-speed `bytes.find`, instead of per-posting position lists.
"""

from __future__ import annotations

import json
import threading
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from aggregator.textindex.engine import AddOutcome, SearchOutcome, StoredDocument, run_search, with_highlights
from aggregator.textindex.query_parser import ParsedQuery, Phrase
from aggregator.textindex.tokenizer import TokenizerConfig, run_terms

ID_BYTES = array("I").itemsize
DROPPED = 0


def copy_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON round trip: detached from the caller, and exactly what sqlite stores and returns."""
    copied: dict[str, Any] = json.loads(json.dumps(dict(metadata)))
    return copied


class PhrasePattern:
    """A phrase as byte patterns over encoded runs: contiguous segments of term ids.

    A query phrase whose tokens are not on consecutive runs (a short word dropped in
    between) has several segments; the runs between them may hold anything.
    """

    def __init__(self, phrase: Phrase, ids: Sequence[int]) -> None:
        segments: list[tuple[int, list[int]]] = []
        for offset, term_id in zip(phrase.offsets, ids, strict=True):
            if segments and segments[-1][0] + len(segments[-1][1]) == offset:
                segments[-1][1].append(term_id)
            else:
                segments.append((offset, [term_id]))
        self.head = array("I", segments[0][1]).tobytes()
        self.rest = [(offset * ID_BYTES, array("I", seg).tobytes()) for offset, seg in segments[1:]]

    def occurs_in(self, runs: bytes) -> bool:
        at = runs.find(self.head)
        while at >= 0:
            aligned = at % ID_BYTES == 0
            if aligned and all(runs[at + off : at + off + len(pat)] == pat for off, pat in self.rest):
                return True
            at = runs.find(self.head, at + 1)
        return False


class MemoryIndex:
    """Documents, term frequencies and encoded runs in dictionaries, guarded by one lock."""

    backend = "memory"

    def __init__(self, name: str, config: TokenizerConfig) -> None:
        self.name = name
        self.config = config
        self._lock = threading.Lock()
        self._docs: dict[str, StoredDocument] = {}
        self._runs: dict[str, bytes] = {}
        self._tf: dict[str, dict[str, int]] = {}
        self._ids: dict[str, int] = {}  # term -> id; ids are never reused, so never removed
        self._terms: list[str] = [""]  # id -> term; id 0 is a dropped run

    def _encode(self, terms: list[str | None]) -> bytes:
        ids = array("I")
        for term in terms:
            if term is None:
                ids.append(DROPPED)
                continue
            term_id = self._ids.get(term)
            if term_id is None:
                term_id = self._ids[term] = len(self._terms)
                self._terms.append(term)
            ids.append(term_id)
        return ids.tobytes()

    def _decode(self, runs: bytes) -> list[str | None]:
        ids = array("I")
        ids.frombytes(runs)
        return [None if term_id == DROPPED else self._terms[term_id] for term_id in ids]

    def add(self, doc_id: str, content: str, metadata: Mapping[str, Any]) -> AddOutcome:
        terms = run_terms(content, self.config)
        counts = Counter(term for term in terms if term is not None)
        stored = StoredDocument(doc_id, content, copy_metadata(metadata))
        with self._lock:
            replaced = doc_id in self._docs
            if replaced:
                self._remove(doc_id)
            self._docs[doc_id] = stored
            self._runs[doc_id] = self._encode(terms)
            for term, tf in counts.items():
                self._tf.setdefault(self._terms[self._ids[term]], {})[doc_id] = tf
        return AddOutcome("re-indexed" if replaced else "indexed", doc_id, counts.total())

    def _remove(self, doc_id: str) -> None:
        del self._docs[doc_id]
        for term in set(self._decode(self._runs.pop(doc_id))):
            if term is not None:
                posting = self._tf[term]
                del posting[doc_id]
                if not posting:
                    del self._tf[term]

    def search(self, query: ParsedQuery, k: int) -> SearchOutcome:
        with self._lock:
            matches = run_search(self, query, k)
        return with_highlights(matches, self.config, query)

    def doc_count(self) -> int:
        return len(self._docs)

    # PostingsReader, called by run_search with the lock held.
    def snapshot_doc_count(self) -> int:
        return len(self._docs)

    def frequencies(self, term: str) -> Mapping[str, int]:
        return self._tf.get(term, {})

    def phrase_docs(self, phrase: Phrase, candidates: set[str]) -> set[str]:
        ids = [self._ids.get(token) for token in phrase.tokens]
        if any(term_id is None for term_id in ids):
            return set()
        pattern = PhrasePattern(phrase, [term_id for term_id in ids if term_id is not None])
        return {doc for doc in candidates if pattern.occurs_in(self._runs[doc])}

    def documents(self, doc_ids: Sequence[str]) -> Mapping[str, StoredDocument]:
        return {doc_id: self._docs[doc_id] for doc_id in doc_ids}

    def state(self) -> dict[str, Any]:
        """The logical content, order-independent (same shape as `SqliteIndex.state`): for tests."""
        with self._lock:
            postings: dict[str, dict[str, tuple[int, ...]]] = {}
            for doc_id, runs in self._runs.items():
                for position, term in enumerate(self._decode(runs)):
                    if term is not None:
                        found = postings.setdefault(term, {}).setdefault(doc_id, ())
                        postings[term][doc_id] = (*found, position)
            return {
                "docs": {d: (s.content, s.metadata) for d, s in sorted(self._docs.items())},
                "postings": {t: dict(sorted(p.items())) for t, p in sorted(postings.items())},
                "tf": {t: dict(sorted(p.items())) for t, p in sorted(self._tf.items())},
            }

    def close(self) -> None:
        return None
