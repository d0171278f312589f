"""Incremental inverted index and deterministic ranking of `catalog_search_tools` (DESIGN §2.2).

Documents are the exposed tools of every loaded catalog plus one *server card*
per upstream whose catalog is not loaded (its name and operator metadata). A
card lets `load: false` searches point at servers not started yet, and keeps
tool and server scores on one scale.

The ranking is BM25F. A tool has fields: its name, title, description,
parameters (property names and their descriptions), annotations, and its
server's name and operator metadata; a name of several tokens is also one
`identifier` token (`get_file`), which a query that writes the name matches
whole. A vocabulary term's weight in a document is

    tf' = Σ_field  field weight × tf(term, field) / (1 − b_f + b_f × len(field) / pivot_f)
    w   = tf' × (k1 + 1) / (tf' + k1)

(per-field length normalisation, then one saturation over the fields summed).
The pivots are fixed field lengths (about the mean over the dev sets' ~9,000
tools), not the catalog's running average: a document's weights then depend
on its own content only, so loading one upstream never rewrites the postings
of the others.

Score of a document = Σ over the query's terms (in sorted order, so the float
sum is the same however the catalogs were loaded) of

    query weight × idf(tier) × tier factor × w(best matching vocabulary term)

- query weight: 1 for a word of the query, less for a stop word and for a word
  the tool lexicon adds (`lexicon.py`).
- tier: the quality of the match of the query term with a vocabulary term:
  exact (equal token) > stem (equal Snowball stem) > prefix > substring. Prefix
  and substring need a query token of at least 3 characters (one for Han/kana).
  Each tier has its own idf, from the number of documents matching the token at
  that tier or better; as idf and tier factor both fall from exact to
  substring, an exact match outweighs a partial one for the same field and tf.

A query word and the words the lexicon adds for it form one group, scored as
Lucene's dis_max: the group's best term counts in full, the others at the
share `lexicon_tie`. Synonyms are alternatives for one word of the request, so
a tool that repeats the concept in several words must not outscore one that
names it once.

Ties break on (server, tool). No randomness, no model: the same catalog content
and query always give the same floats and the same order.

Lookups are indexed, never scanned: postings per token; a stem table for the
exact tier; a trigram table (single characters for Han/kana) over the
vocabulary for prefix and substring candidates. Everything is updated
incrementally when one upstream's catalog loads, changes or goes away.
Retrieval of the top k uses MaxScore pruning over postings split into levels by
falling weight, so the long postings of common words are mostly probed
for documents that matched something rarer, not walked.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

from aggregator.catalog.lexicon import QueryTerm, query_terms
from aggregator.catalog.model import Catalog, ToolEntry
from aggregator.catalog.store import CatalogStore
from aggregator.catalog.tokens import identifier, identifiers, is_cjk, is_identifier, stem, tokenize

Postings = dict[int, float]  # document id → the term's best field weight in that document
Tier = tuple[tuple[str, float], ...]  # vocabulary terms, each with a weight factor
_HEAD = 32  # size of the first level of a postings list split by weight
_BIG = 4 * _HEAD  # a token may read postings longer than this in place
_BATCH = 128  # documents scored together during top-k retrieval
_TOKEN_CACHE = 4096  # query tokens whose expansion is kept
_STATS_BUDGET = 400_000  # entries of per-token match tables kept between queries (~30 MB)
MAX_INDEXED_CHARS = 16_384  # of one description or parameter text: a 1 MB one would block the loop on load


FIELDS = ("name", "identifier", "title", "description", "params", "annotations", "server_name", "server_description")


@dataclass(frozen=True, slots=True)
class RankingParams:
    """Weights of the ranking. The defaults are the shipped values, chosen on all five dev sets together
    (`benchmarks/tune_search.py`)."""

    name: float = 4.0
    identifier: float = 4.0  # the whole name as one token, for a query that names the tool
    title: float = 2.0
    description: float = 1.0
    params: float = 1.0
    annotations: float = 0.3
    server_name: float = 2.0
    server_description: float = 0.25
    name_b: float = 0.25
    description_b: float = 0.75
    params_b: float = 0.75
    server_b: float = 0.75
    k1: float = 1.2
    stem_match: float = 0.7  # equal stems, different surface forms
    prefix: float = 0.5
    substring: float = 0.1
    stop_word: float = 0.2  # query weight of a stop word (a query of stop words only counts them in full)
    expansion: float = 0.2  # query weight of a term the lexicon adds
    expansion_absent: float = 0.7  # ... for a query word the catalog does not hold at all
    lexicon_tie: float = 0.3  # share of a group's terms other than its best (dis_max tie breaker)
    min_partial: int = 3  # shortest non-CJK query token that may prefix/substring-match

    def field_weight(self, field: str) -> float:
        return float(getattr(self, field))

    def field_b(self, field: str) -> float:
        if field in ("name", "title"):
            return self.name_b
        if field in ("server_name", "server_description"):
            return self.server_b
        if field in ("annotations", "identifier"):
            return 0.0
        return self.description_b if field == "description" else self.params_b


# Field lengths (tokens) at which length normalisation is neutral: about the mean
# over the tools of the five dev sets in ../shared/data/toolsearch.
PIVOTS = {
    "name": 2.5,
    "identifier": 1.0,
    "title": 2.5,
    "description": 24.0,
    "params": 16.0,
    "annotations": 1.0,
    "server_name": 2.5,
    "server_description": 20.0,
}
TIER_NAMES = ("exact", "stem", "prefix", "substring")


DEFAULT_PARAMS = RankingParams()


@dataclass(frozen=True, slots=True)
class Hit:
    """A tool-level result: the tool, and its raw (unrounded) score."""

    server: str
    tool: str
    score: float
    entry: ToolEntry


@dataclass(frozen=True, slots=True)
class Match:
    """One query term's part of a tool's score (`ToolSearchIndex.explain`)."""

    query_term: str
    origin: str  # "query", "stop word" or "lexicon: <query word>"
    term: str  # the vocabulary term it matched
    tier: str  # exact, stem, prefix or substring
    fields: tuple[str, ...]  # the tool's fields holding that term
    contribution: float


@dataclass(frozen=True, slots=True)
class ServerHit:
    """A server-level result: an upstream whose catalog is not loaded matched on its metadata."""

    server: str
    score: float
    description: str
    capabilities: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Doc:
    server: str
    tool: str | None  # None for a server card
    entry: ToolEntry | None
    terms: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class _Level:
    """Some documents of a postings list, and the highest weight among them."""

    bound: float
    docs: Sequence[int]


@dataclass(frozen=True, slots=True)
class _Source:
    """Part of what a query token adds to a document's score: `scale × table[doc]`."""

    table: Mapping[int, float]
    scale: float
    levels: tuple[_Level, ...]  # the table's documents by falling weight
    owned: bool = False  # built for this token (merged postings), not postings read in place


@dataclass(frozen=True, slots=True)
class _TokenStats:
    """What one query token is worth: per document, the highest value over its sources."""

    sources: tuple[_Source, ...]
    cards: dict[int, float]  # the same for server cards, worked out
    weight: float  # the token's rarity (idf over every tier); 0: matches nothing

    def scaled(self, factor: float) -> _TokenStats:
        if factor == 1.0:
            return self
        sources = tuple(_Source(s.table, s.scale * factor, s.levels, s.owned) for s in self.sources)
        return _TokenStats(sources, {d: v * factor for d, v in self.cards.items()}, self.weight)


_NO_MATCH = _TokenStats((), {}, 0.0)
Group = tuple[tuple[_Source, ...], ...]  # a query word and its lexicon words: each member's sources


def _stats_size(stats: _TokenStats) -> int:
    """Entries a token's match tables hold of their own (postings read in place are not counted)."""
    own = sum(2 * len(s.table) for s in stats.sources if s.owned)  # the table and its levels
    return own + len(stats.cards) + 1


def _levels(table: Mapping[int, float]) -> tuple[_Level, ...]:
    """The table's documents by falling weight, in levels of _HEAD, 4×_HEAD, 16×_HEAD, ... entries.

    Top-k retrieval walks the best levels first; the long tail of a common word
    is then often provably unable to change the top k.
    """
    if len(table) <= _HEAD:
        return (_Level(max(table.values(), default=0.0), list(table)),)
    ranked = sorted(table.items(), key=itemgetter(1), reverse=True)
    levels = []
    start, size = 0, _HEAD
    while start < len(ranked):
        level = ranked[start : start + size]
        levels.append(_Level(level[0][1], [d for d, _ in level]))
        start += size
        size *= 4
    return tuple(levels)


def _grams(term: str) -> set[str]:
    """Keys of the partial-match table: trigrams, or the characters of a Han/kana term."""
    if is_cjk(term):
        return set(term)
    return {term[i : i + 3] for i in range(len(term) - 2)}


def _term_grams(term: str) -> set[str]:
    """The grams a vocabulary term is filed under: none for an identifier, which matches only whole."""
    return set() if is_identifier(term) else _grams(term)


def annotation_tokens(annotations: Mapping[str, Any] | None) -> list[str]:
    """Tokens of a tool's annotations: each hint set to true as one token, and string values.

    `readOnlyHint: true` gives `readonly`, not `read` + `only`: nearly every tool
    carries hints, and splitting them would make "read" or "open" look common
    in the catalog and weigh them down in every query. ("read only" still
    prefix-matches `readonly`.)
    """
    if not annotations:
        return []
    tokens: list[str] = []
    for key in sorted(annotations):
        value = annotations[key]
        if value is True:
            joined = "".join(tokenize(key.removesuffix("Hint")))
            if joined:
                tokens.append(joined)
        elif isinstance(value, str):
            tokens.extend(tokenize(value))
    return tokens


def _tokens_of(texts: Iterable[str]) -> list[str]:
    return [token for text in texts for token in tokenize(text[:MAX_INDEXED_CHARS])]


def param_texts(schema: Mapping[str, Any]) -> list[str]:
    """The input schema's top-level property names and their descriptions, in name order."""
    props = schema.get("properties")
    if not isinstance(props, dict):
        return []
    texts: list[str] = []
    for name in sorted(props):
        texts.append(str(name))
        spec = props[name]
        if isinstance(spec, dict) and isinstance(spec.get("description"), str):
            texts.append(spec["description"])
    return texts


def field_frequencies(fields: Mapping[str, list[str]], p: RankingParams) -> dict[str, float]:
    """Term → its BM25F pseudo frequency in `fields` (field → tokens): each field's count
    times the field's weight over its length normalisation, summed over the fields."""
    pseudo: dict[str, float] = {}
    for field, tokens in fields.items():
        if not tokens:
            continue
        b = p.field_b(field)
        scale = p.field_weight(field) / (1 - b + b * len(tokens) / PIVOTS[field])
        for term, tf in Counter(tokens).items():
            pseudo[term] = pseudo.get(term, 0.0) + scale * tf
    return pseudo


def bm25f_terms(
    fields: Mapping[str, list[str]], p: RankingParams, shared: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Term → its BM25F weight in a document made of `fields` and of `shared`, the
    `field_frequencies` of fields every tool of a server has (its name and description).

    Terms are interned: thousands of documents hold "get" or "file", and one string
    object for each saves about a quarter of the index's memory."""
    pseudo = field_frequencies(fields, p)
    for term, tf in (shared or {}).items():
        pseudo[term] = pseudo.get(term, 0.0) + tf
    return {sys.intern(term): tf * (p.k1 + 1) / (tf + p.k1) for term, tf in pseudo.items() if tf > 0}


def _raise_to(best: dict[int, float], table: Mapping[int, float], scale: float) -> None:
    """best[d] = max(best[d], scale × table[d]) for every d in table."""
    if not best:
        best.update({d: scale * w for d, w in table.items()})
    else:
        best.update({d: v for d, w in table.items() if (v := scale * w) > best.get(d, 0.0)})


class ToolSearchIndex:
    """The search index over loaded catalogs and the metadata of configured upstreams."""

    def __init__(self, params: RankingParams = DEFAULT_PARAMS) -> None:
        self._p = params
        self._docs: dict[int, _Doc] = {}  # tools have ids > 0, server cards ids < 0
        self._tool_ids: dict[str, list[int]] = {}
        self._card_ids: dict[str, int] = {}
        self._meta: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._catalogs: dict[str, Catalog] = {}
        self._tool_postings: dict[str, Postings] = {}
        self._card_postings: dict[str, Postings] = {}
        self._doc_freq: Counter[str] = Counter()  # documents (tools and cards) holding each term
        self._stems: dict[str, set[str]] = {}
        self._grams: dict[str, set[str]] = {}
        self._levels: dict[str, tuple[_Level, ...]] = {}  # per term, dropped when its postings change
        self._expansions: dict[tuple[str, bool], tuple[Tier, Tier, Tier]] = {}
        self._stats: dict[tuple[str, bool], _TokenStats] = {}
        self._stats_size = 0
        self._next_id = 1

    # ------------------------------------------------------------ following the catalogs

    def attach(self, store: CatalogStore) -> Callable[[], None]:
        """Index what `store` holds and follow its changes. Returns an unsubscribe function."""
        for catalog in store.loaded().values():
            self.load_catalog(catalog)
        return store.subscribe(self._on_change)

    def _on_change(self, server: str, catalog: Catalog | None) -> None:
        if catalog is None:
            self.drop_catalog(server)
        else:
            self.load_catalog(catalog)

    def set_server_metadata(self, server: str, description: str | None, capabilities: Iterable[str]) -> None:
        """An upstream's operator metadata: part of each of its tools, and its card while unloaded."""
        self._meta[server] = ((description or "").strip(), tuple(capabilities))
        if server in self._catalogs:
            self.load_catalog(self._catalogs[server])
        else:
            self._set_card(server)

    def has_server_metadata(self, server: str) -> bool:
        return server in self._meta

    def load_catalog(self, catalog: Catalog) -> None:
        """(Re)index the exposed tools of one upstream's catalog, replacing what was there."""
        server = catalog.server
        self._remove_tools(server)
        self._remove_card(server)
        self._catalogs[server] = catalog
        shared = field_frequencies(self._server_fields(server), self._p)
        self._tool_ids[server] = [
            self._add_doc(_Doc(server, entry.name, entry, bm25f_terms(self._own_fields(entry), self._p, shared)))
            for entry in catalog.exposed_tools
        ]

    def drop_catalog(self, server: str) -> None:
        """Forget one upstream's tools; its card comes back if it has metadata."""
        self._remove_tools(server)
        self._catalogs.pop(server, None)
        if server in self._meta:
            self._set_card(server)

    def loaded_servers(self) -> list[str]:
        return sorted(self._catalogs)

    @property
    def document_count(self) -> int:
        return len(self._docs)

    @property
    def vocabulary_size(self) -> int:
        return len(self._doc_freq)

    def clear_cache(self) -> None:
        """Forget every cached lookup (rebuilt on demand); benchmarks measure cold searches so."""
        self._levels.clear()
        self._forget_queries()

    def _forget_queries(self) -> None:
        self._expansions.clear()
        self._stats.clear()
        self._stats_size = 0

    # ------------------------------------------------------------ documents

    def _server_fields(self, server: str) -> dict[str, list[str]]:
        description, capabilities = self._meta.get(server, ("", ()))
        return {
            "server_name": tokenize(server),
            "server_description": [*tokenize(description), *_tokens_of(capabilities)],
        }

    def fields(self, entry: ToolEntry) -> dict[str, list[str]]:
        """The tokens of each field of a tool, as indexed: its own and its server's."""
        return {**self._own_fields(entry), **self._server_fields(entry.server)}

    @staticmethod
    def _own_fields(entry: ToolEntry) -> dict[str, list[str]]:
        return {
            "name": (name := tokenize(entry.name)),
            "identifier": [] if (whole := identifier(name)) is None else [whole],
            "title": tokenize(entry.title),
            "description": tokenize(entry.description[:MAX_INDEXED_CHARS]),
            "params": _tokens_of(param_texts(entry.input_schema)),
            "annotations": annotation_tokens(entry.annotations),
        }

    def _card_fields(self, server: str) -> dict[str, list[str]]:
        """A card's fields: on its own, the server's name and description weigh as a tool's."""
        fields = self._server_fields(server)
        return {"name": fields["server_name"], "description": fields["server_description"]}

    def _set_card(self, server: str) -> None:
        self._remove_card(server)
        self._card_ids[server] = self._add_doc(
            _Doc(server, None, None, bm25f_terms(self._card_fields(server), self._p))
        )

    def _remove_card(self, server: str) -> None:
        doc_id = self._card_ids.pop(server, None)
        if doc_id is not None:
            self._remove_doc(doc_id)

    def _remove_tools(self, server: str) -> None:
        for doc_id in self._tool_ids.pop(server, []):
            self._remove_doc(doc_id)

    def _add_doc(self, doc: _Doc) -> int:
        card = doc.tool is None
        doc_id = -self._next_id if card else self._next_id
        self._next_id += 1
        self._docs[doc_id] = doc
        postings_map = self._card_postings if card else self._tool_postings
        doc_freq = self._doc_freq
        for term, weight in doc.terms.items():
            postings = postings_map.get(term)
            if postings is None:
                postings_map[term] = {doc_id: weight}
            else:
                postings[doc_id] = weight
            if term in doc_freq:
                doc_freq[term] += 1
            else:
                doc_freq[term] = 1
                self._add_term(term)
        self._forget_levels(doc.terms)
        self._forget_queries()
        return doc_id

    def _remove_doc(self, doc_id: int) -> None:
        doc = self._docs.pop(doc_id)
        postings_map = self._card_postings if doc_id < 0 else self._tool_postings
        for term in doc.terms:
            postings = postings_map[term]
            del postings[doc_id]
            if not postings:
                del postings_map[term]
            self._doc_freq[term] -= 1
            if not self._doc_freq[term]:
                del self._doc_freq[term]
                self._remove_term(term)
        self._forget_levels(doc.terms)
        self._forget_queries()

    def _forget_levels(self, terms: Mapping[str, float]) -> None:
        """Drop the cached levels of `terms`, whose postings changed."""
        if self._levels:
            for term in self._levels.keys() & terms.keys():
                del self._levels[term]

    def _add_term(self, term: str) -> None:
        self._stems.setdefault(stem(term), set()).add(term)
        for gram in _term_grams(term):
            self._grams.setdefault(gram, set()).add(term)

    def _remove_term(self, term: str) -> None:
        key = stem(term)
        self._stems[key].discard(term)
        if not self._stems[key]:
            del self._stems[key]
        for gram in _term_grams(term):
            terms = self._grams[gram]
            terms.discard(term)
            if not terms:
                del self._grams[gram]

    # ------------------------------------------------------------ token lookup

    def _expand(self, token: str, partial: bool) -> tuple[Tier, Tier, Tier]:
        """The vocabulary terms `token` matches, per tier: (exact, prefix, substring); the
        last two stay empty unless `partial`."""
        cached = self._expansions.get((token, partial))
        if cached is not None:
            return cached
        same_stem = self._stems.get(stem(token), set())
        exact = tuple((t, 1.0 if t == token else self._p.stem_match) for t in sorted(same_stem))
        prefix: list[tuple[str, float]] = []
        substring: list[tuple[str, float]] = []
        candidates = self._partial_candidates(token) if partial else set()
        for term in sorted(candidates - same_stem):
            (prefix if term.startswith(token) else substring).append((term, 1.0))
        expansion = (exact, tuple(prefix), tuple(substring))
        if len(self._expansions) >= _TOKEN_CACHE:
            self._expansions.clear()
        self._expansions[token, partial] = expansion
        return expansion

    def _partial_candidates(self, token: str) -> set[str]:
        """Vocabulary terms that contain `token` and are longer, found through the gram table."""
        if not (len(token) >= self._p.min_partial or is_cjk(token)):
            return set()
        sets = []
        for gram in _grams(token):
            terms = self._grams.get(gram)
            if terms is None:
                return set()
            sets.append(terms)
        sets.sort(key=len)
        found = set(sets[0]).intersection(*sets[1:])
        found.discard(token)
        if len(token) > 3 or is_cjk(token):
            found = {t for t in found if token in t}
        return found

    def _idf(self, df: int) -> float:
        n = len(self._docs)
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def _token_stats(self, token: str, partial: bool = True) -> _TokenStats:
        """What `token` is worth in each document (cached until the index changes, oldest out first)."""
        cached = self._stats.get((token, partial))
        if cached is None:
            cached = self._stats[token, partial] = self._compute_stats(token, partial)
            self._stats_size += _stats_size(cached)
            while self._stats_size > _STATS_BUDGET and len(self._stats) > 1:
                self._stats_size -= _stats_size(self._stats.pop(next(iter(self._stats))))
        return cached

    def _doc_freqs(self, tiers: tuple[Tier, Tier, Tier]) -> list[int]:
        """Documents matching at the exact tier, at prefix or better, at any tier."""
        counts = [0, 0, 0]
        for postings_map in (self._tool_postings, self._card_postings):
            matched: set[int] = set()
            for level, tier in enumerate(tiers):
                for term, _ in tier:
                    matched.update(postings_map.get(term, ()))
                counts[level] += len(matched)
        return counts

    def _scaled_terms(self, token: str, partial: bool) -> list[tuple[str, str, float]]:
        """(vocabulary term, tier name, idf × tier factor) of every term `token` matches."""
        tiers = self._expand(token, partial)
        doc_freqs = self._doc_freqs(tiers)
        if not doc_freqs[2]:
            return []
        p = self._p
        scaled: list[tuple[str, str, float]] = []
        for level, (tier, df, factor) in enumerate(zip(tiers, doc_freqs, (1.0, p.prefix, p.substring), strict=True)):
            if tier:
                idf = self._idf(df) * factor
                for term, term_factor in tier:
                    name = TIER_NAMES[level + 1] if level else TIER_NAMES[0 if term == token else 1]
                    scaled.append((term, name, idf * term_factor))
        return scaled

    def _compute_stats(self, token: str, partial: bool) -> _TokenStats:
        scaled_terms = self._scaled_terms(token, partial)
        if not scaled_terms:
            return _NO_MATCH
        scaled = [(term, scale) for term, _, scale in scaled_terms]
        # The longest postings list is read in place (its levels cached per term);
        # the others are merged into one table, so a document is probed at most twice.
        longest = max(scaled, key=lambda item: (len(self._tool_postings.get(item[0], ())), item[0]))[0]
        sources: list[_Source] = []
        merged: dict[int, float] = {}
        cards: dict[int, float] = {}
        for term, scale in scaled:
            table = self._tool_postings.get(term)
            if table and term == longest and len(table) > _BIG:
                sources.append(_Source(table, scale, self._term_levels(term, table)))
            elif table:
                _raise_to(merged, table, scale)
            _raise_to(cards, self._card_postings.get(term, {}), scale)
        if merged:
            sources.append(_Source(merged, 1.0, _levels(merged), owned=True))
        return _TokenStats(tuple(sources), cards, 1.0)

    def _term_levels(self, term: str, table: Postings) -> tuple[_Level, ...]:
        levels = self._levels.get(term)
        if levels is None:
            levels = self._levels[term] = _levels(table)
        return levels

    # ------------------------------------------------------------ ranking

    def query_terms(self, query: str) -> list[QueryTerm]:
        """The weighted terms `query` searches for (its words, stop words, lexicon additions), sorted."""
        p = self._p
        present = self._present
        return query_terms(tokenize(query) + identifiers(query), p.stop_word, p.expansion, p.expansion_absent, present)

    def _present(self, token: str) -> bool:
        return self._token_stats(token).weight > 0

    def _query_groups(self, query: str) -> list[list[_TokenStats]]:
        """Per query word (sorted), the stats of it and its lexicon words that match anything,
        each scaled by its query weight, in sorted term order."""
        groups: dict[str, list[_TokenStats]] = {}
        for term in self.query_terms(query):
            stats = self._token_stats(term.token, term.partial)
            if stats.weight > 0:
                groups.setdefault(term.word, []).append(stats.scaled(term.weight))
        return [groups[word] for word in sorted(groups)]

    def explain(self, query: str, server: str, tool: str) -> list[Match]:
        """How the tool's score for `query` is made: per query term, the vocabulary term that
        counted, its tier, the fields holding it, and what it added (the sum is the score)."""
        doc = next((self._docs[d] for d in self._tool_ids.get(server, []) if self._docs[d].tool == tool), None)
        if doc is None or doc.entry is None:
            return []
        fields = self.fields(doc.entry)
        matches = []
        qterms = self.query_terms(query)
        for word in sorted({q.word for q in qterms}):
            found = []
            for qterm in (q for q in qterms if q.word == word):
                best: tuple[float, str, str] | None = None
                for term, tier, scale in self._scaled_terms(qterm.token, qterm.partial):
                    weight = doc.terms.get(term)
                    if weight is not None and (best is None or qterm.weight * scale * weight > best[0]):
                        best = (qterm.weight * scale * weight, term, tier)
                if best is not None:
                    found.append((qterm, best))
            top = max(found, key=lambda item: item[1][0], default=None)
            for qterm, (value, term, tier) in found:
                share = 1.0 if (qterm, (value, term, tier)) == top else self._p.lexicon_tie
                holding = tuple(f for f in FIELDS if term in fields.get(f, ()))
                matches.append(Match(qterm.token, qterm.origin, term, tier, holding, share * value))
        return matches

    def search(self, query: str, limit: int) -> list[Hit]:
        """The best `limit` exposed tools of loaded catalogs, by score, ties on (server, tool)."""
        groups = self._query_groups(query)
        if not groups or limit <= 0:
            return []
        scored = _TopK([tuple(m.sources for m in g) for g in groups], limit, self._p.lexicon_tie).run()
        hits = []
        for doc_id, score in _top(list(scored.items()), limit, self._docs):
            doc = self._docs[doc_id]
            assert doc.entry is not None and doc.tool is not None
            hits.append(Hit(doc.server, doc.tool, score, doc.entry))
        return hits

    def all_scores(self, query: str) -> dict[tuple[str, str], float]:
        """The score of every matching exposed tool, by (server, tool), without pruning.

        `search` returns the best of these; tests and diagnostics compare against it.
        """
        groups = [tuple(m.sources for m in g) for g in self._query_groups(query)]
        matched = {d for group in groups for member in group for source in member for d in source.table}
        scores = _bulk_scores(matched, groups, self._p.lexicon_tie)
        docs = self._docs
        return {(docs[d].server, docs[d].tool or ""): score for d, score in scores.items()}

    def search_servers(self, query: str, servers: Iterable[str]) -> list[ServerHit]:
        """Upstreams among `servers` whose catalog is not loaded and whose name or metadata matches."""
        wanted = {self._card_ids[s] for s in servers if s in self._card_ids}
        word_groups = self._query_groups(query)
        if not word_groups or not wanted:
            return []
        found = {d for g in word_groups for m in g for d in m.cards if d in wanted}
        groups = [tuple((_Source(m.cards, 1.0, ()),) for m in g) for g in word_groups]
        scored = _bulk_scores(found, groups, self._p.lexicon_tie)
        hits = []
        for doc_id, score in _top(list(scored.items()), len(scored), self._docs):
            server = self._docs[doc_id].server
            description, capabilities = self._meta.get(server, ("", ()))
            hits.append(ServerHit(server, score, description, capabilities))
        return hits


# ---------------------------------------------------------------- retrieval


def _token_values(docs: Mapping[int, Any], sources: Sequence[_Source]) -> dict[int, float]:
    """Per document of `docs` that the token matches, its highest value over the sources.

    Each source is walked or probed, whichever is shorter.
    """
    values: dict[int, float] = {}
    for source in sources:
        table, scale = source.table, source.scale
        if len(table) <= len(docs):
            found = {d: scale * w for d, w in table.items() if d in docs}
        else:
            get = table.get
            found = {d: scale * w for d in docs if (w := get(d)) is not None}
        if not values:
            values = found
        else:
            values.update({d: v for d, v in found.items() if v > values.get(d, 0.0)})
    return values


def _group_values(docs: Mapping[int, Any], group: Group, tie: float) -> dict[int, float]:
    """Per document of `docs` that the group matches: its best member's value plus `tie` × the others'."""
    if len(group) == 1:
        return _token_values(docs, group[0])
    best: dict[int, float] = {}
    total: dict[int, float] = {}
    for member in group:
        for d, v in _token_values(docs, member).items():
            total[d] = total.get(d, 0.0) + v
            if v > best.get(d, 0.0):
                best[d] = v
    return {d: b + tie * (total[d] - b) for d, b in best.items()}


def _bulk_scores(docs: Iterable[int], groups: Sequence[Group], tie: float) -> dict[int, float]:
    """Full scores of `docs`: per document, the sum of its group values in group order.

    Group order is sorted query-word order, so a document's float sum does not
    depend on which documents were scored together or how they were found.
    """
    totals = dict.fromkeys(docs, 0.0)
    for group in groups:
        values = _group_values(totals, group, tie)
        totals.update({d: totals[d] + v for d, v in values.items()})
    return totals


class _TopK:
    """Finds a set of documents, with exact scores, that surely holds the top `limit`.

    MaxScore pruning. Every source of every group (a query word and its lexicon
    words) is split into blocks (its levels, by falling value), taken from the
    highest bound down; their new documents are scored a batch at a time. A
    group's *ceiling* is what it can add to a document not seen so far: from
    the highest bound of each member's blocks not taken yet, combined as the
    group's values are (dis_max). Groups whose ceilings sum to less than the
    current `limit`-th best score become *non-essential*, for good: a document
    that only they match cannot reach the top, so their blocks are no longer
    walked (a document they match together with an essential group is found
    through that group's blocks, and scored in full). When every group is
    non-essential, retrieval is over.

    Scoring a batch first adds group values in order of falling group bound and
    drops a document as soon as even the best values of its remaining groups
    could not lift it to the `limit`-th best score (most candidates of a common
    word go after one or two probes); survivors are then scored exactly, in
    sorted group order, so their floats do not depend on how they were found.
    """

    def __init__(self, groups: Sequence[Group], limit: int, tie: float) -> None:
        self.groups = groups
        self.limit = limit
        self.tie = tie
        # per group, its sources flattened: (member index, source)
        self.sources = [[(m, source) for m, member in enumerate(g) for source in member] for g in groups]
        self.taken = [[0] * len(sources) for sources in self.sources]  # per source, levels taken so far
        self.non_essential: set[int] = set()
        self.non_essential_sum = 0.0  # sum of their ceilings, frozen when they joined
        self.seen: set[int] = set()
        self.scored: dict[int, float] = {}
        self.best: list[float] = []  # the `limit` best scores so far, best first
        bounds = [self._ceiling(i) for i in range(len(groups))]
        self.order = sorted(range(len(groups)), key=lambda i: -bounds[i])
        self.rest = [0.0] * (len(groups) + 1)  # rest[p]: sum of the bounds of order[p:]
        for pos in range(len(groups) - 1, -1, -1):
            self.rest[pos] = self.rest[pos + 1] + bounds[self.order[pos]]

    def run(self) -> dict[int, float]:
        blocks = sorted(
            (-source.scale * level.bound, i, j, k)
            for i, sources in enumerate(self.sources)
            for j, (_, source) in enumerate(sources)
            for k, level in enumerate(source.levels)
        )
        batch: dict[int, None] = {}
        for _, i, j, k in blocks:
            if len(batch) >= _BATCH or (len(self.best) < self.limit <= len(self.best) + len(batch)):
                self._score(batch)
                batch = {}
            self._update_non_essential()
            if len(self.non_essential) == len(self.groups):
                break
            if i in self.non_essential:
                continue
            self.taken[i][j] = k + 1
            batch.update((d, None) for d in self.sources[i][j][1].levels[k].docs if d not in self.seen)
        self._score(batch)
        return self.scored

    def _full(self) -> bool:
        return len(self.best) >= self.limit

    def _ceiling(self, i: int) -> float:
        """The most group `i` can add to a document in none of its blocks taken so far."""
        member_bounds = [0.0] * len(self.groups[i])
        for (m, source), k in zip(self.sources[i], self.taken[i], strict=True):
            if k < len(source.levels):
                member_bounds[m] = max(member_bounds[m], source.scale * source.levels[k].bound)
        top = max(member_bounds, default=0.0)
        return top + self.tie * (sum(member_bounds) - top)

    def _update_non_essential(self) -> None:
        if not self._full():
            return
        floor = self.best[-1] * (1 - 1e-9)
        ceilings = {i: self._ceiling(i) for i in range(len(self.groups)) if i not in self.non_essential}
        for i in sorted(ceilings, key=lambda i: (ceilings[i], i)):
            if self.non_essential_sum + ceilings[i] >= floor:
                break
            self.non_essential.add(i)
            self.non_essential_sum += ceilings[i]

    def _score(self, batch: dict[int, None]) -> None:
        self.seen.update(batch)
        alive: dict[int, float] = dict.fromkeys(batch, 0.0)
        if self._full():
            floor = self.best[-1] * (1 - 1e-9)
            for pos, i in enumerate(self.order):
                values = _group_values(alive, self.groups[i], self.tie)
                alive.update({d: alive[d] + v for d, v in values.items()})
                rest = self.rest[pos + 1]
                alive = {d: s for d, s in alive.items() if s + rest >= floor}
                if not alive:
                    return
        fresh = _bulk_scores(alive, self.groups, self.tie)
        self.scored.update(fresh)
        self.best = heapq.nlargest(self.limit, chain(self.best, fresh.values()))


def _top(items: list[tuple[int, float]], limit: int, docs: Mapping[int, _Doc]) -> list[tuple[int, float]]:
    """The `limit` best (document, score) pairs: score descending, ties on (server, tool)."""
    if limit <= 0 or not items:
        return []
    if len(items) > limit:
        threshold = heapq.nlargest(limit, items, key=itemgetter(1))[-1][1]
        items = [item for item in items if item[1] >= threshold]

    def key(item: tuple[int, float]) -> tuple[float, str, str]:
        doc = docs[item[0]]
        return (-item[1], doc.server, doc.tool or "")

    return sorted(items, key=key)[:limit]
