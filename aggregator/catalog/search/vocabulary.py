"""The terms of the index's vocabulary a query token matches, by tier (`scoring.TIER_NAMES`).

Tiers, from best to weakest: exact (the same token) and stem (the same
Snowball stem, another surface form), prefix (a longer term starting with the
token) and substring (a longer term containing it). Prefix and substring need
a query token of at least `RankingParams.min_partial` characters (one for
Han/kana), and only a word of the query itself may match at those tiers.

Lookups are indexed, never scanned: a stem table gives the exact tier, a
trigram table (single characters for Han/kana) over the vocabulary the
candidates for prefix and substring. Both follow the vocabulary as documents
come and go; the stem table is made at the first lookup (stemming loads PyStemmer).
"""

from __future__ import annotations

from aggregator.catalog.search.scoring import RankingParams
from aggregator.catalog.search.tokens import inflection_pair, is_cjk, is_identifier, stem

Tier = tuple[tuple[str, float], ...]  # vocabulary terms, each with a weight factor
Tiers = tuple[Tier, Tier, Tier]  # exact (with stem), prefix, substring
_TOKEN_CACHE = 4096  # query tokens whose expansion is kept


def grams(term: str) -> set[str]:
    """Keys of the partial-match table: trigrams, or the characters of a Han/kana term."""
    if is_cjk(term):
        return set(term)
    return {term[i : i + 3] for i in range(len(term) - 2)}


def term_grams(term: str) -> set[str]:
    """The grams a vocabulary term is filed under: none for an identifier, which matches only whole."""
    return set() if is_identifier(term) else grams(term)


class Vocabulary:
    """The stem and gram tables over the index's terms, and the tiers a query token matches."""

    def __init__(self, params: RankingParams) -> None:
        self._p = params
        self._stems: dict[str, set[str]] | None = None  # built at the first lookup (`_stem_table`)
        self._unstemmed: set[str] | None = set()  # the terms until then
        self._grams: dict[str, set[str]] = {}
        self._expansions: dict[tuple[str, bool], Tiers] = {}

    def add(self, term: str) -> None:
        """A term that no document held before."""
        if self._stems is None:
            assert self._unstemmed is not None
            self._unstemmed.add(term)
        else:
            self._stems.setdefault(stem(term), set()).add(term)
        for gram in term_grams(term):
            self._grams.setdefault(gram, set()).add(term)

    def remove(self, term: str) -> None:
        """A term that the last document holding it took away."""
        if self._stems is None:
            assert self._unstemmed is not None
            self._unstemmed.discard(term)
        else:
            key = stem(term)
            self._stems[key].discard(term)
            if not self._stems[key]:
                del self._stems[key]
        for gram in term_grams(term):
            terms = self._grams[gram]
            terms.discard(term)
            if not terms:
                del self._grams[gram]

    def forget(self) -> None:
        """Drop the cached expansions (the vocabulary changed)."""
        self._expansions.clear()

    def expand(self, token: str, partial: bool) -> Tiers:
        """The vocabulary terms `token` matches, per tier: (exact, prefix, substring); the
        last two stay empty unless `partial`."""
        cached = self._expansions.get((token, partial))
        if cached is not None:
            return cached
        same_stem = self._stem_table().get(stem(token), set())
        exact = tuple((t, self._stem_factor(token, t)) for t in sorted(same_stem))
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

    def _stem_table(self) -> dict[str, set[str]]:
        """The terms by stem, made at the first lookup rather than as documents come: stemming loads
        PyStemmer (0.7 MB of RSS), which a `serve` whose client never searches does not need."""
        if self._stems is None:
            assert self._unstemmed is not None
            stems: dict[str, set[str]] = {}
            for term in self._unstemmed:
                stems.setdefault(stem(term), set()).add(term)
            self._stems, self._unstemmed = stems, None
        return self._stems

    def _stem_factor(self, token: str, term: str) -> float:
        """How much a vocabulary term of the token's stem counts: in full when it is the token, an
        inflection of it at `inflection_match`, a derived word at `stem_match` (sense-safe stemming)."""
        if term == token:
            return 1.0
        return self._p.inflection_match if inflection_pair(token, term) else self._p.stem_match

    def _partial_candidates(self, token: str) -> set[str]:
        """Vocabulary terms that contain `token` and are longer, found through the gram table."""
        if not (len(token) >= self._p.min_partial or is_cjk(token)):
            return set()
        sets = []
        for gram in grams(token):
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
