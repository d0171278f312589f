"""Deterministic tool search of `catalog_search_tools` (DESIGN §2.2).

Read in this order: `tokens` (the words of a text), `documents` (the fields of a
tool), `scoring` (weights, BM25F, idf), `vocabulary` (the match tiers of a query
token), `query` (stop words and the lexicon), `index` (postings and a query
token's value per document), `retrieval` (top k), `meaning` (the re-rank of
the best by closeness in meaning) and `explain`.
"""

from aggregator.catalog.search.documents import MAX_INDEXED_CHARS, annotation_tokens
from aggregator.catalog.search.explain import Match
from aggregator.catalog.search.index import Hit, ServerHit, ToolSearchIndex
from aggregator.catalog.search.scoring import DEFAULT_PARAMS, FIELDS, RankingParams

__all__ = [
    "DEFAULT_PARAMS",
    "FIELDS",
    "MAX_INDEXED_CHARS",
    "Hit",
    "Match",
    "RankingParams",
    "ServerHit",
    "ToolSearchIndex",
    "annotation_tokens",
]
