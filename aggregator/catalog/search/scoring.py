"""The ranking's weights and BM25F: what a term is worth in a document, and a query term's idf.

A tool has fields: its name, title, description, parameters (property names
and their descriptions), annotations, and its server's name and operator
metadata; a name of several tokens is also one `identifier` token
(`get_file`), which a query that writes the name matches whole. A vocabulary
term's weight in a document is

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
  the tool lexicon adds (`query.py`).
- tier: the quality of the match of the query term with a vocabulary term:
  exact (equal token) > stem (equal Snowball stem) > prefix > substring
  (`vocabulary.py`). Each tier has its own idf, from the number of documents
  matching the token at that tier or better; as idf and tier factor both fall
  from exact to substring, an exact match outweighs a partial one for the same
  field and tf.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

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
    server_description: float = 0.5
    name_b: float = 0.5
    description_b: float = 0.75
    params_b: float = 0.75
    server_b: float = 0.75
    k1: float = 1.2
    stem_match: float = 0.4  # equal stems, a derived word ("commitment" for "commit"): often another sense
    inflection_match: float = 0.7  # equal stems, an inflection ("commits", "staging" for "stage")
    prefix: float = 0.5
    substring: float = 0.1
    stop_word: float = 0.2  # query weight of a stop word (a query of stop words only counts them in full)
    expansion: float = 0.2  # query weight of a term the lexicon adds
    expansion_absent: float = 0.7  # ... for a query word the catalog does not hold at all
    number: float = 0.7  # query weight of a number ("2023" in "Today is 2023-03-17" is rarely the request)
    related: float = 0.0  # query weight (× similarity) of a word the related-terms table adds (query.py)
    related_absent: float = 0.4  # ... for a query word the catalog does not hold at all
    related_rare: float = 0.1  # ... for a query word at most `rare_holders` tools hold
    rare_holders: int = 1
    common_slope: float = 0.4  # a query word's weight falls this much per unit of Zipf frequency ...
    common_pivot: float = 4.9  # ... above this one (English at large: "find" 5.8, "stage" 5.1, "apartments" 4.0) ...
    common_floor: float = 0.5  # ... down to this (query.Commonness)
    lexicon_tie: float = 0.3  # share of a group's terms other than its best (dis_max tie breaker)
    coverage: float = 0.1  # a score × (share of the query's word weight the tool matches) ** this
    name_damping: float = 0.5  # a query word matching a verb-object name's object, its verb not asked for: × this
    meaning: float = 0.6  # among the best `meaning_head`, a tool adds this × the best score × cosine (meaning.py)
    meaning_head: int = 10
    meaning_named: float = 0.75  # ... its cosine at least this when the query says the tool's whole name
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


def field_frequencies(fields: Mapping[str, list[str]], p: RankingParams) -> dict[str, float]:
    """Term → its BM25F pseudo frequency in `fields` (field → tokens): each field's count
    times the field's weight over its length normalisation, summed over the fields."""
    pseudo: dict[str, float] = {}
    for field, tokens in fields.items():
        if not tokens:
            continue
        b = p.field_b(field)
        scale = p.field_weight(field) / (1 - b + b * len(tokens) / PIVOTS[field])
        counts: dict[str, int] = {}  # a plain dict: Counter's constructor costs more than the counting
        for term in tokens:
            counts[term] = counts.get(term, 0) + 1
        for term, tf in counts.items():
            pseudo[term] = pseudo.get(term, 0.0) + scale * tf
    return pseudo


def bm25f_terms(
    fields: Mapping[str, list[str]], p: RankingParams, shared: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Term → its BM25F weight in a document made of `fields` and of `shared`, the
    `field_frequencies` of fields every tool of a server has (its name and description).

    Terms come interned from the tokenizer (`tokens.tokenize`, `documents.tool_fields`):
    thousands of documents hold "get" or "file", and one string object for each saves
    about a quarter of the index's memory."""
    pseudo = field_frequencies(fields, p)
    for term, tf in (shared or {}).items():
        pseudo[term] = pseudo.get(term, 0.0) + tf
    k1 = p.k1
    return {term: tf * (k1 + 1) / (tf + k1) for term, tf in pseudo.items() if tf > 0}


def idf(documents: int, df: int) -> float:
    """The BM25 (Lucene) idf of a token that `df` of `documents` documents match."""
    return math.log(1.0 + (documents - df + 0.5) / (df + 0.5))
