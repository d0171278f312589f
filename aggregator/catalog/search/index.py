"""Incremental inverted index and deterministic ranking of `catalog_search_tools` (DESIGN §2.2).

Documents are the exposed tools of every loaded catalog plus one *server card*
per upstream whose catalog is not loaded (its name and operator metadata). A
card lets `load: false` searches point at servers not started yet, and keeps
tool and server scores on one scale.

A tool's score is BM25F over its fields (`scoring.py`), summed over the
query's terms (`query.py`) at the tier each matches (`vocabulary.py`); the top
k are found without scoring every match (`retrieval.py`). The best few are then
re-ranked by how close in meaning each tool's text is to the query, from a
shipped table of word vectors (`meaning.py`).

Ties break on (server, tool). No randomness, no model: the same catalog content
and query always give the same floats and the same order.

Everything is updated incrementally when one upstream's catalog loads, changes
or goes away: postings per token, the vocabulary's stem and gram tables, and
the document frequencies; cached query work is dropped on every change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from aggregator.catalog.model import Catalog, ToolEntry
from aggregator.catalog.search.documents import (
    NameParts,
    card_fields,
    changing,
    counted_server_fields,
    name_parts,
    server_fields,
    tool_fields,
)
from aggregator.catalog.search.explain import Match, explain
from aggregator.catalog.search.meaning import Vector, cosine, word_vectors
from aggregator.catalog.search.query import LITERAL, NAME, Commonness, QueryTerm, coverage_weights, lexicon, query_terms
from aggregator.catalog.search.retrieval import (
    BIG,
    NO_MATCH,
    Combine,
    Level,
    Source,
    TokenStats,
    TopK,
    bulk_scores,
    raise_to,
    split_levels,
    stats_size,
    top,
)
from aggregator.catalog.search.scoring import (
    DEFAULT_PARAMS,
    TIER_NAMES,
    RankingParams,
    bm25f_terms,
    field_frequencies,
    idf,
)
from aggregator.catalog.search.tokens import dotted_words, identifiers, names, stem, tokenize
from aggregator.catalog.search.vocabulary import Tiers, Vocabulary
from aggregator.catalog.store import CatalogStore

Postings = dict[int, float]  # document id → the term's best field weight in that document
# a word opening a question: the request reads, as with a reading verb (`ToolSearchIndex._damped`)
QUESTION = frozenset({"what", "whats", "which", "where", "who", "whom", "whose", "when", "how"})
_STATS_BUDGET = 400_000  # entries of per-token match tables kept between queries (~30 MB)


@dataclass(frozen=True, slots=True)
class Hit:
    """A tool-level result: the tool, and its raw (unrounded) score."""

    server: str
    tool: str
    score: float
    entry: ToolEntry


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
        self._vocabulary = Vocabulary(params)
        self._levels: dict[str, tuple[Level, ...]] = {}  # per term, dropped when its postings change
        self._stats: dict[tuple[str, bool], TokenStats] = {}
        self._stats_size = 0
        self._next_id = 1
        self._name_parts: dict[int, NameParts] = {}  # tools whose name is a verb and its object
        self._by_object: dict[str, set[int]] = {}  # stem of an object word of a changing verb's name → those tools
        self._verbs: dict[str, int] = {}  # stem of a name's verb → how many names open with it
        self._unparsed_names: dict[int, tuple[list[str], list[str]]] = {}  # tool → its name's and server's tokens
        self._meanings: dict[int, Vector | None] = {}  # tool → its text's vector (`meaning.py`), made on first use

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
        fields = self._server_fields(server)
        shared = field_frequencies(fields, self._p)
        tools = catalog.exposed_tools
        self._tool_ids[server] = [self._add_doc(self._tool_doc(entry, fields, shared)) for entry in tools]
        for doc_id, entry in zip(self._tool_ids[server], tools, strict=True):
            self._unparsed_names[doc_id] = (tokenize(entry.name), fields["server_name"])

    def _parse_names(self) -> None:
        """Work out the verb and object of the names loaded since the last search (`name_parts`):
        at the first search, not at load, since stemming loads the stemmer (issue 24: memory)."""
        kinds = changing() if self._unparsed_names else {}
        for doc_id, (name, server) in self._unparsed_names.items():
            parts = name_parts(name, server)
            if parts is not None:
                self._name_parts[doc_id] = parts
                self._verbs[parts[0]] = self._verbs.get(parts[0], 0) + 1
                for word in parts[1] if parts[0] in kinds else ():
                    self._by_object.setdefault(word, set()).add(doc_id)
        self._unparsed_names.clear()

    def _tool_doc(self, entry: ToolEntry, server: Mapping[str, list[str]], shared: Mapping[str, float]) -> _Doc:
        """A tool's document: its own fields and its server's (`counted_server_fields`)."""
        own = tool_fields(entry)
        counted = counted_server_fields(own, server)
        if len(counted) < len(server):
            shared = field_frequencies(counted, self._p)
        return _Doc(entry.server, entry.name, entry, bm25f_terms(own, self._p, shared))

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
        return len(self._tool_postings.keys() | self._card_postings.keys())

    def clear_cache(self) -> None:
        """Forget every cached lookup (rebuilt on demand); benchmarks measure cold searches so."""
        self._levels.clear()
        self._forget_queries()

    def _forget_queries(self) -> None:
        self._vocabulary.forget()
        self._stats.clear()
        self._stats_size = 0

    # ------------------------------------------------------------ documents

    def _server_fields(self, server: str) -> dict[str, list[str]]:
        description, capabilities = self._meta.get(server, ("", ()))
        return server_fields(server, description, capabilities)

    def fields(self, entry: ToolEntry) -> dict[str, list[str]]:
        """The tokens of each field of a tool, as indexed: its own and its server's."""
        own = tool_fields(entry)
        return {**own, **counted_server_fields(own, self._server_fields(entry.server))}

    def _set_card(self, server: str) -> None:
        self._remove_card(server)
        self._card_ids[server] = self._add_doc(
            _Doc(server, None, None, bm25f_terms(card_fields(self._server_fields(server)), self._p))
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
        postings_map, others = self._postings_maps(card)
        for term, weight in doc.terms.items():
            postings = postings_map.get(term)
            if postings is not None:
                postings[doc_id] = weight
            else:
                postings_map[term] = {doc_id: weight}
                if term not in others:
                    self._vocabulary.add(term)
        self._forget_levels(doc.terms)
        self._forget_queries()
        return doc_id

    def _remove_doc(self, doc_id: int) -> None:
        doc = self._docs.pop(doc_id)
        self._unparsed_names.pop(doc_id, None)
        self._meanings.pop(doc_id, None)
        parts = self._name_parts.pop(doc_id, None)
        if parts is not None:
            self._verbs[parts[0]] -= 1
            if not self._verbs[parts[0]]:
                del self._verbs[parts[0]]
        for word in parts[1] if parts and parts[0] in changing() else ():
            self._by_object[word].discard(doc_id)
            if not self._by_object[word]:
                del self._by_object[word]
        postings_map, others = self._postings_maps(doc_id < 0)
        for term in doc.terms:
            postings = postings_map[term]
            del postings[doc_id]
            if not postings:
                del postings_map[term]
                if term not in others:
                    self._vocabulary.remove(term)
        self._forget_levels(doc.terms)
        self._forget_queries()

    def _postings_maps(self, card: bool) -> tuple[dict[str, Postings], dict[str, Postings]]:
        """The postings of a document's kind (cards or tools), and of the other kind: a term is
        in the vocabulary while either holds it."""
        if card:
            return self._card_postings, self._tool_postings
        return self._tool_postings, self._card_postings

    def _forget_levels(self, terms: Mapping[str, float]) -> None:
        """Drop the cached levels of `terms`, whose postings changed."""
        if self._levels:
            for term in self._levels.keys() & terms.keys():
                del self._levels[term]

    # ------------------------------------------------------------ token lookup

    def _token_stats(self, token: str, partial: bool = True) -> TokenStats:
        """What `token` is worth in each document (cached until the index changes, oldest out first)."""
        cached = self._stats.get((token, partial))
        if cached is None:
            cached = self._stats[token, partial] = self._compute_stats(token, partial)
            self._stats_size += stats_size(cached)
            while self._stats_size > _STATS_BUDGET and len(self._stats) > 1:
                self._stats_size -= stats_size(self._stats.pop(next(iter(self._stats))))
        return cached

    def _doc_freqs(self, tiers: Tiers) -> list[int]:
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
        tiers = self._vocabulary.expand(token, partial)
        doc_freqs = self._doc_freqs(tiers)
        if not doc_freqs[2]:
            return []
        p = self._p
        scaled: list[tuple[str, str, float]] = []
        for level, (tier, df, factor) in enumerate(zip(tiers, doc_freqs, (1.0, p.prefix, p.substring), strict=True)):
            if tier:
                token_idf = idf(len(self._docs), df) * factor
                for term, term_factor in tier:
                    name = TIER_NAMES[level + 1] if level else TIER_NAMES[0 if term == token else 1]
                    scaled.append((term, name, token_idf * term_factor))
        return scaled

    def _compute_stats(self, token: str, partial: bool) -> TokenStats:
        scaled_terms = self._scaled_terms(token, partial)
        if not scaled_terms:
            return NO_MATCH
        scaled = [(term, scale) for term, _, scale in scaled_terms]
        # The longest postings list is read in place (its levels cached per term);
        # the others are merged into one table, so a document is probed at most twice.
        longest = max(scaled, key=lambda item: (len(self._tool_postings.get(item[0], ())), item[0]))[0]
        sources: list[Source] = []
        merged: dict[int, float] = {}
        cards: dict[int, float] = {}
        for term, scale in scaled:
            table = self._tool_postings.get(term)
            if table and term == longest and len(table) > BIG:
                sources.append(Source(table, scale, self._term_levels(term, table)))
            elif table:
                raise_to(merged, table, scale)
            raise_to(cards, self._card_postings.get(term, {}), scale)
        if merged:
            sources.append(Source(merged, 1.0, split_levels(merged), owned=True))
        return TokenStats(tuple(sources), cards, 1.0)

    def _term_levels(self, term: str, table: Postings) -> tuple[Level, ...]:
        levels = self._levels.get(term)
        if levels is None:
            levels = self._levels[term] = split_levels(table)
        return levels

    # ------------------------------------------------------------ ranking

    def query_terms(self, query: str) -> list[QueryTerm]:
        """The weighted terms `query` searches for (its words, stop words, lexicon additions), sorted."""
        p = self._p
        present = self._present
        tokens = tokenize(query) + identifiers(query)
        return query_terms(
            tokens,
            p.stop_word,
            p.expansion,
            p.expansion_absent,
            present,
            names(query),
            related_weight=p.related,
            number_weight=p.number,
            related_absent=p.related_absent,
            commonness=Commonness(p.common_slope, p.common_pivot, p.common_floor),
            rare=self._rare if p.related_rare > 0 else None,
            related_rare=p.related_rare,
            dotted=dotted_words(query),
        )

    def _present(self, token: str) -> bool:
        """Whether some document holds `token` or a word of its stem: "put" inside "input" does not
        make the catalog hold "put", so "put" still lends its lexicon words in full."""
        return self._token_stats(token, partial=False).weight > 0

    def _rare(self, token: str) -> bool:
        """Whether at most `rare_holders` tools hold `token` or a word of its stem."""
        most = self._p.rare_holders
        tables = [source.table for source in self._token_stats(token, partial=False).sources]
        sizes = [len(table) for table in tables]
        if not sizes or max(sizes) > most:
            return False
        return sum(sizes) <= most or len(set().union(*tables)) <= most

    def _query_groups(self, query: str) -> tuple[list[list[TokenStats]], Combine]:
        """Per query word (sorted), the stats of it and its lexicon words that match anything,
        each scaled by its query weight, in sorted term order; and how their values combine."""
        groups: dict[str, list[TokenStats]] = {}
        terms = self.query_terms(query)
        for term in terms:
            stats = self._token_stats(term.token, term.partial)
            if stats.weight > 0:
                groups.setdefault(term.word, []).append(stats.scaled(term.weight))
        words = sorted(groups)
        weights = coverage_weights(terms)
        position = {word: i for i, word in enumerate(words)}
        found = self._damped(query, terms)
        damped = {d: frozenset(position[w] for w in ws if w in position) for d, ws in found.items()}
        combine = Combine(
            self._p.lexicon_tie, tuple(weights[word] for word in words), self._p.coverage, damped, self._p.name_damping
        )
        return [groups[word] for word in words], combine

    def _damped(self, query: str, terms: list[QueryTerm]) -> dict[int, frozenset[str]]:
        """When the request opens with a verb (a word that opens a tool's name, a changing verb or
        a word of the lexicon: "delete the rows of the events table", "query the db") or a
        question word (a question reads: "what's in the payments table"): per tool
        whose name is a changing verb and its object
        (`documents.name_parts`, `changing`), whose verb the request does not ask for (nor a
        lexicon word of it) and is of another kind than the request's, the query words that match
        its name's object words: that "table" says little for `create_table`."""
        self._parse_names()
        kinds_of = changing()
        tokens = tokenize(query)
        opening = stem(tokens[0]) if tokens else ""
        verb_first = opening in self._verbs or opening in kinds_of or opening in lexicon().known
        if self._p.name_damping >= 1.0 or not (verb_first or opening in QUESTION):
            return {}
        if any(t.word == tokens[0] and t.origin.startswith(f"lexicon: {tokens[0]} ") for t in terms):
            return {}  # "add" of "add up": its phrase's sense, not its own
        asked = [t for t in terms if t.origin in (LITERAL, NAME) or t.origin.startswith("lexicon")]
        verbs = {stem(t.token) for t in asked}
        kinds = kinds_of.get(opening, frozenset())
        damped: dict[int, set[str]] = {}
        own = f"lexicon: {tokens[0]}"  # the opening verb's own lexicon words ("link": relation) name its action
        for term in (t for t in asked if t.origin != own):
            for doc_id in self._by_object.get(stem(term.token), ()):
                if (verb := self._name_parts[doc_id][0]) not in verbs and not kinds_of[verb] & kinds:
                    damped.setdefault(doc_id, set()).add(term.word)
        return {doc_id: frozenset(found) for doc_id, found in damped.items()}

    def explain(self, query: str, server: str, tool: str) -> list[Match]:
        """How the tool's score for `query` is made: per query term, the vocabulary term that
        counted, its tier, the fields holding it, and what it added (the sum is the score)."""
        doc_id = next((d for d in self._tool_ids.get(server, []) if self._docs[d].tool == tool), None)
        doc = None if doc_id is None else self._docs[doc_id]
        if doc_id is None or doc is None or doc.entry is None:
            return []
        qterms, fields, p = self.query_terms(query), self.fields(doc.entry), self._p
        damped = (self._damped(query, qterms).get(doc_id, frozenset()), p.name_damping)
        matches = explain(qterms, self._scaled_terms, doc.terms, fields, p.lexicon_tie, p.coverage, damped)
        return matches + self._explain_meaning(query, doc_id) if matches else matches

    def _explain_meaning(self, query: str, doc_id: int) -> list[Match]:
        """What closeness in meaning adds to the tool, as `search` adds it (`_by_meaning`): nothing
        unless it is among the best `meaning_head` by its words."""
        groups, combine = self._query_groups(query)
        if self._p.meaning <= 0 or not groups:
            return []
        ranked = self._best_by_words(groups, combine, self._p.meaning_head)
        if doc_id not in {d for d, _ in ranked}:
            return []
        boost = self.meaning_boosts(query, [doc_id], ranked[0][1]).get(doc_id, 0.0)
        closeness = boost / (self._p.meaning * ranked[0][1])
        return [Match("(meaning)", "meaning", f"closeness {closeness:.3f}", "", (), boost)] if boost else []

    def search(self, query: str, limit: int) -> list[Hit]:
        """The best `limit` exposed tools of loaded catalogs, by score, ties on (server, tool)."""
        groups, combine = self._query_groups(query)
        if not groups or limit <= 0:
            return []
        depth = max(limit, self._p.meaning_head if self._p.meaning > 0 else 0)
        hits = []
        for doc_id, score in self._by_meaning(query, self._best_by_words(groups, combine, depth))[:limit]:
            doc = self._docs[doc_id]
            assert doc.entry is not None and doc.tool is not None
            hits.append(Hit(doc.server, doc.tool, score, doc.entry))
        return hits

    def _best_by_words(self, groups: list[list[TokenStats]], combine: Combine, depth: int) -> list[tuple[int, float]]:
        """The best `depth` tools by their words alone (pruned top k), best first, ties on (server, tool)."""
        scored = TopK([tuple(m.sources for m in g) for g in groups], depth, combine).run()
        return top(list(scored.items()), depth, self._names)

    def _by_meaning(self, query: str, ranked: list[tuple[int, float]]) -> list[tuple[int, float]]:
        """`ranked` (best first) with its first `meaning_head` re-ranked: each adds what its
        closeness in meaning to the query is worth (`meaning_boosts`, never negative). The others
        keep their scores, which are no higher than any re-ranked one's."""
        head = self._p.meaning_head
        if self._p.meaning <= 0 or not ranked:
            return ranked
        boosts = self.meaning_boosts(query, [doc_id for doc_id, _ in ranked[:head]], ranked[0][1])
        rescored = [(doc_id, score + boosts.get(doc_id, 0.0)) for doc_id, score in ranked[:head]]
        return sorted(rescored, key=lambda item: (-item[1], self._names(item[0]))) + ranked[head:]

    def meaning_boosts(self, query: str, doc_ids: Iterable[int], best: float) -> dict[int, float]:
        """What closeness in meaning adds to each of `doc_ids` (`_by_meaning`), when positive:
        `meaning` × `best` × the cosine of the tool's vector and the query's, taken as at least
        `meaning_named` when the query says the tool's whole name ("git diff": `git_diff`, whose
        sibling `git_diff_staged` may be closer in the vectors' sense)."""
        table = word_vectors()
        words = tokenize(query)
        wanted = table.text_vector(words) if table is not None else None
        if table is None or wanted is None:
            return {}
        said, p = set(words), self._p
        boosts = {}
        for doc_id in doc_ids:
            if doc_id not in self._meanings:
                self._meanings[doc_id] = table.text_vector(self._meaning_words(doc_id))
            vector, entry = self._meanings[doc_id], self._docs[doc_id].entry
            similarity = cosine(wanted, vector) if vector is not None else 0.0
            if entry is not None and (name := tokenize(entry.name)) and said.issuperset(name):
                similarity = max(similarity, p.meaning_named)
            if similarity > 0:
                boosts[doc_id] = p.meaning * best * similarity
        return boosts

    def _meaning_words(self, doc_id: int) -> list[str]:
        """The words of a tool whose vector is compared: its name, description and parameter
        names, and its server's metadata where that says something the description does not."""
        entry = self._docs[doc_id].entry
        assert entry is not None
        words = tokenize(entry.name) + tokenize(entry.description)
        words += [word for key in entry.arg_keys for word in tokenize(key)]
        description, capabilities = self._meta.get(entry.server, ("", ()))
        for text in (description, *capabilities):
            if text and text not in entry.description:
                words += tokenize(text)
        return words

    def all_scores(self, query: str) -> dict[tuple[str, str], float]:
        """The score of every matching exposed tool, by (server, tool), without pruning, the best
        `meaning_head` re-ranked as `search` re-ranks them (`_by_meaning`).

        `search` returns the best of these; tests and diagnostics compare against it.
        """
        word_groups, combine = self._query_groups(query)
        groups = [tuple(m.sources for m in g) for g in word_groups]
        matched = {d for group in groups for member in group for source in member for d in source.table}
        scores = bulk_scores(matched, groups, combine)
        ranked = self._by_meaning(query, top(list(scores.items()), len(scores), self._names))
        docs = self._docs
        return {(docs[d].server, docs[d].tool or ""): score for d, score in ranked}

    def _names(self, doc_id: int) -> tuple[str, str]:
        """(server, tool) of a document, the order of equal scores; a card's tool is ""."""
        doc = self._docs[doc_id]
        return doc.server, doc.tool or ""

    def search_servers(self, query: str, servers: Iterable[str]) -> list[ServerHit]:
        """Upstreams among `servers` whose catalog is not loaded and whose name or metadata matches."""
        wanted = {self._card_ids[s] for s in servers if s in self._card_ids}
        word_groups, combine = self._query_groups(query)
        if not word_groups or not wanted:
            return []
        found = {d for g in word_groups for m in g for d in m.cards if d in wanted}
        groups = [tuple((Source(m.cards, 1.0, ()),) for m in g) for g in word_groups]
        scored = bulk_scores(found, groups, combine)
        hits = []
        for doc_id, score in top(list(scored.items()), len(scored), self._names):
            server = self._docs[doc_id].server
            description, capabilities = self._meta.get(server, ("", ()))
            hits.append(ServerHit(server, score, description, capabilities))
        return hits
