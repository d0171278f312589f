"""Deterministic tool search of `catalog_search_tools` (DESIGN §2.2): tokens, query analysis, the index."""

from aggregator.catalog.search.index import (
    DEFAULT_PARAMS,
    FIELDS,
    Hit,
    Match,
    RankingParams,
    ServerHit,
    ToolSearchIndex,
    annotation_tokens,
)

__all__ = [
    "DEFAULT_PARAMS",
    "FIELDS",
    "Hit",
    "Match",
    "RankingParams",
    "ServerHit",
    "ToolSearchIndex",
    "annotation_tokens",
]
