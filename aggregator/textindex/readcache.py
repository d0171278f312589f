"""What a sqlite index has read, kept while the file has not changed under it.

Reading the postings of a common term is the slow part of a sqlite search (one row
per document containing it). The cache keeps, per term, doc_id -> tf, least
recently used terms evicted beyond `max_postings` entries, plus the document count
and the integer id -> doc_id map. It is only valid for one `PRAGMA data_version` of
the file: a commit by any other connection (another aggregator process) changes the
version and empties it, while this connection's own adds update it in place.
Document ids are never reused (rows are updated, never deleted), so the id map
stays valid across versions and only grows.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

DEFAULT_MAX_POSTINGS = 1_000_000


class ReadCache:
    def __init__(self, max_postings: int = DEFAULT_MAX_POSTINGS) -> None:
        self.max_postings = max_postings
        self.version: int | None = None
        self.doc_count: int | None = None
        self.doc_ids: dict[int, str] = {}
        self.max_doc = 0
        self._tf: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._size = 0  # cached postings, plus one per cached term

    def check_version(self, version: int) -> None:
        """Empty the version-bound parts if the file changed since they were read."""
        if version != self.version:
            self._tf.clear()
            self._size = 0
            self.doc_count = None
            self.version = version

    def add_doc_ids(self, rows: list[tuple[int, str]]) -> None:
        for doc, doc_id in rows:
            self.doc_ids[doc] = doc_id
            self.max_doc = max(self.max_doc, doc)

    def frequencies(self, term: str) -> dict[str, int] | None:
        posting = self._tf.get(term)
        if posting is not None:
            self._tf.move_to_end(term)
        return posting

    def store(self, term: str, posting: dict[str, int]) -> None:
        self._tf[term] = posting
        self._size += len(posting) + 1
        while self._size > self.max_postings and len(self._tf) > 1:
            _, evicted = self._tf.popitem(last=False)
            self._size -= len(evicted) + 1

    def after_add(self, doc: int, doc_id: str, old: Mapping[str, int], new: Mapping[str, int], created: bool) -> None:
        """Apply this connection's committed add (old and new term counts of the document)."""
        if created:
            self.add_doc_ids([(doc, doc_id)])
            if self.doc_count is not None:
                self.doc_count += 1
        for term in old.keys() | new.keys():
            posting = self._tf.get(term)
            if posting is None:
                continue
            self._size -= len(posting)
            if term in new:
                posting[doc_id] = new[term]
            else:
                posting.pop(doc_id, None)
            self._size += len(posting)
