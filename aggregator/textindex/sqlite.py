"""The persistent backend: one SQLite file per index.

The file holds the tokenizer config (`meta`), the documents and the postings
(term, document, tf, run positions). A search reads, inside one read transaction,
only the postings of its query terms and the documents it returns; matching and
scoring are the shared `engine.run_search`, so results equal the memory backend's.

Durability: WAL mode with `synchronous=FULL`, one `BEGIN IMMEDIATE` transaction per
add, so a crash mid-add loses only that add, and other processes sharing the file
wait on the busy timeout instead of failing. A new file is built under a temporary
name and linked into place, so a half-created index never appears.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import threading
import uuid
from array import array
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from aggregator.files import fsync_dir
from aggregator.textindex.engine import (
    AddOutcome,
    SearchOutcome,
    StoredDocument,
    run_search,
    with_highlights,
)
from aggregator.textindex.memory import PhrasePattern, copy_metadata
from aggregator.textindex.query_parser import ParsedQuery, Phrase
from aggregator.textindex.readcache import ReadCache
from aggregator.textindex.tokenizer import TokenizerConfig, TokenizerConfigError, term_positions

FORMAT = "aggregator-textindex"
FORMAT_VERSION = "1"
BUSY_TIMEOUT_MS = 10_000
_IN_CHUNK = 500

_SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE documents(
    id INTEGER PRIMARY KEY,
    doc_id TEXT NOT NULL UNIQUE,
    content TEXT NOT NULL,
    metadata TEXT NOT NULL,
    token_count INTEGER NOT NULL
);
CREATE TABLE postings(
    term TEXT NOT NULL,
    doc INTEGER NOT NULL,
    tf INTEGER NOT NULL,
    positions BLOB NOT NULL,
    PRIMARY KEY (term, doc)
) WITHOUT ROWID;
"""


class IndexFileExists(FileExistsError):
    """The index file appeared before ours could be linked into place."""


class IndexFileError(Exception):
    """The file is not a readable index of this format; the message says why."""


def _pack(positions: Sequence[int]) -> bytes:
    packed = array("I", positions)
    if sys.byteorder == "big":
        packed.byteswap()  # the file format is little-endian
    return packed.tobytes()


def _unpack(blob: bytes) -> array[int]:
    positions = array("I")
    positions.frombytes(blob)
    if sys.byteorder == "big":
        positions.byteswap()
    return positions


def _connect(path: Path) -> sqlite3.Connection:
    """Open an existing file read-write; never creates one (`mode=rw`)."""
    uri = path.resolve().as_uri() + "?mode=rw"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    return conn


def _write_new_file(path: Path, config: TokenizerConfig) -> None:
    """Build an empty index at a temporary name, then link it to `path` unless that exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)  # a private temporary file: no transaction needed
            conn.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?)",
                [
                    ("format", FORMAT),
                    ("format_version", FORMAT_VERSION),
                    ("tokenizer_config", json.dumps(config.to_dict(), sort_keys=True)),
                ],
            )
        finally:
            conn.close()
        try:
            os.link(tmp, path)  # atomic and exclusive: never replaces another process's index
        except FileExistsError as exc:
            raise IndexFileExists(str(path)) from exc
        except OSError:  # a filesystem without hard links
            if path.exists():
                raise IndexFileExists(str(path)) from None
            os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _read_config(conn: sqlite3.Connection, path: Path) -> TokenizerConfig:
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        conn.execute("SELECT id, doc_id, content, metadata, token_count FROM documents LIMIT 0")
        conn.execute("SELECT term, doc, tf, positions FROM postings LIMIT 0")
    except sqlite3.DatabaseError as exc:
        raise IndexFileError(f"{path.name} is not an index file ({exc})") from exc
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        found = f"{meta.get('format')!r} version {meta.get('format_version')!r}"
        raise IndexFileError(f"{path.name} has an unknown format {found}")
    try:
        return TokenizerConfig.from_dict(json.loads(meta["tokenizer_config"]))
    except (KeyError, ValueError, TokenizerConfigError) as exc:
        raise IndexFileError(f"{path.name} has a bad tokenizer config ({exc})") from exc


class SqliteIndex:
    """An index stored in one SQLite file; one connection, serialized by a lock."""

    backend = "sqlite"

    def __init__(self, name: str, path: Path, conn: sqlite3.Connection, config: TokenizerConfig) -> None:
        self.name = name
        self.path = path
        self.config = config
        self._conn = conn
        self._lock = threading.Lock()  # one connection: every use holds the lock
        self._cache = ReadCache()

    @classmethod
    def create(cls, name: str, path: Path, config: TokenizerConfig) -> SqliteIndex:
        """A new empty index file; `IndexFileExists` if `path` already exists."""
        if path.exists():
            raise IndexFileExists(str(path))
        _write_new_file(path, config)
        return cls.open(name, path)

    @classmethod
    def open(cls, name: str, path: Path) -> SqliteIndex:
        """Open an existing index file; `IndexFileError` if it is not one."""
        try:
            conn = _connect(path)
        except sqlite3.Error as exc:
            raise IndexFileError(f"{path.name} cannot be opened ({exc})") from exc
        try:
            config = _read_config(conn, path)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
        except BaseException:
            conn.close()
            raise
        return cls(name, path, conn, config)

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        """One transaction, rolled back if anything (the commit included) fails; the caller holds the lock."""
        self._conn.execute(begin)
        try:
            yield self._conn
            self._conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
            raise

    def add(self, doc_id: str, content: str, metadata: Mapping[str, Any]) -> AddOutcome:
        postings, token_count = term_positions(content, self.config)
        counts = {term: len(positions) for term, positions in postings.items()}
        meta_json = json.dumps(copy_metadata(metadata))
        with self._lock:
            with self._transaction("BEGIN IMMEDIATE") as conn:
                row = conn.execute("SELECT id, content FROM documents WHERE doc_id = ?", (doc_id,)).fetchone()
                old_counts: dict[str, int] = {}
                if row is None:
                    doc = self._insert_document(doc_id, content, meta_json, token_count)
                else:
                    doc = row[0]
                    old_counts = self._replace_document(doc, row[1], content, meta_json, token_count)
                conn.executemany(
                    "INSERT INTO postings(term, doc, tf, positions) VALUES (?, ?, ?, ?)",
                    [(term, doc, len(pos), _pack(pos)) for term, pos in postings.items()],
                )
            self._cache.after_add(doc, doc_id, old_counts, counts, created=row is None)
        return AddOutcome("indexed" if row is None else "re-indexed", doc_id, token_count)

    def _insert_document(self, doc_id: str, content: str, meta_json: str, token_count: int) -> int:
        cursor = self._conn.execute(
            "INSERT INTO documents(doc_id, content, metadata, token_count) VALUES (?, ?, ?, ?)",
            (doc_id, content, meta_json, token_count),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def _replace_document(
        self, doc: int, old_content: str, content: str, meta_json: str, token_count: int
    ) -> dict[str, int]:
        """Drop the old postings (found by tokenizing the old content) and update the row in place."""
        old_postings, _ = term_positions(old_content, self.config)
        self._conn.executemany(
            "DELETE FROM postings WHERE term = ? AND doc = ?", [(term, doc) for term in old_postings]
        )
        self._conn.execute(
            "UPDATE documents SET content = ?, metadata = ?, token_count = ? WHERE id = ?",
            (content, meta_json, token_count, doc),
        )
        return {term: len(positions) for term, positions in old_postings.items()}

    def search(self, query: ParsedQuery, k: int) -> SearchOutcome:
        with self._lock, self._transaction("BEGIN") as conn:  # one snapshot for everything read
            conn.execute("SELECT 1 FROM meta LIMIT 1").fetchall()  # starts the snapshot...
            self._cache.check_version(conn.execute("PRAGMA data_version").fetchone()[0])  # ...and dates it
            matches = run_search(self, query, k)
        return with_highlights(matches, self.config, query)

    def doc_count(self) -> int:
        with self._lock:
            count: int = self._conn.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
            return count

    # PostingsReader, called by run_search inside the read transaction.
    def snapshot_doc_count(self) -> int:
        if self._cache.doc_count is None:
            self._cache.doc_count = self._conn.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
        return self._cache.doc_count

    def _doc_names(self, rows: list[tuple[int, Any]]) -> list[tuple[str, Any]]:
        """(doc_id, value) for (integer id, value) rows, loading ids not seen yet."""
        names = self._cache.doc_ids
        try:
            return [(names[doc], value) for doc, value in rows]
        except KeyError:
            query = "SELECT id, doc_id FROM documents WHERE id > ?"
            self._cache.add_doc_ids(self._conn.execute(query, (self._cache.max_doc,)).fetchall())
            return [(names[doc], value) for doc, value in rows]

    def frequencies(self, term: str) -> Mapping[str, int]:
        posting = self._cache.frequencies(term)
        if posting is None:
            rows = self._conn.execute("SELECT doc, tf FROM postings WHERE term = ?", (term,)).fetchall()
            posting = dict(self._doc_names(rows))
            self._cache.store(term, posting)
        return posting

    def _positions(self, term: str, candidates: set[str]) -> dict[str, array[int]]:
        rows = self._conn.execute("SELECT doc, positions FROM postings WHERE term = ?", (term,)).fetchall()
        return {doc_id: _unpack(blob) for doc_id, blob in self._doc_names(rows) if doc_id in candidates}

    def phrase_docs(self, phrase: Phrase, candidates: set[str]) -> set[str]:
        distinct = sorted(set(phrase.tokens))
        by_token = {token: self._positions(token, candidates) for token in distinct}
        pattern = PhrasePattern(phrase, [distinct.index(token) + 1 for token in phrase.tokens])
        return {doc for doc in candidates if pattern.occurs_in(_runs([by_token[token][doc] for token in distinct]))}

    def documents(self, doc_ids: Sequence[str]) -> Mapping[str, StoredDocument]:
        found: dict[str, StoredDocument] = {}
        for i in range(0, len(doc_ids), _IN_CHUNK):
            chunk = list(doc_ids[i : i + _IN_CHUNK])
            marks = ",".join("?" * len(chunk))
            rows = self._conn.execute(
                f"SELECT doc_id, content, metadata FROM documents WHERE doc_id IN ({marks})", chunk
            )
            for doc_id, content, metadata in rows.fetchall():
                found[doc_id] = StoredDocument(doc_id, content, json.loads(metadata))
        return found

    def state(self) -> dict[str, Any]:
        """The logical content, in the same shape as `MemoryIndex.state`: for tests."""
        with self._lock, self._transaction("BEGIN") as conn:
            docs = conn.execute("SELECT doc_id, content, metadata FROM documents ORDER BY doc_id").fetchall()
            rows = conn.execute(
                "SELECT p.term, d.doc_id, p.tf, p.positions FROM postings p JOIN documents d ON d.id = p.doc "
                "ORDER BY p.term, d.doc_id"
            ).fetchall()
        postings: dict[str, dict[str, tuple[int, ...]]] = {}
        tf: dict[str, dict[str, int]] = {}
        for term, doc_id, count, blob in rows:
            postings.setdefault(term, {})[doc_id] = tuple(_unpack(blob))
            tf.setdefault(term, {})[doc_id] = count
        return {"docs": {d: (c, json.loads(m)) for d, c, m in docs}, "postings": postings, "tf": tf}

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _runs(positions: Sequence[Sequence[int]]) -> bytes:
    """The document's runs as the memory backend encodes them, holding only the phrase's tokens
    (token i+1 of `positions` at its positions, 0 elsewhere): a phrase is then found with
    `PhrasePattern` in linear time, where intersecting position sets per phrase token was
    quadratic for a long phrase of one repeated word."""
    length = max((max(found) for found in positions if len(found)), default=-1) + 1
    runs = array("I", [0]) * length
    for number, found in enumerate(positions, start=1):
        for position in found:
            runs[position] = number
    return runs.tobytes()
