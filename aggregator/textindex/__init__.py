"""The aggregator's own full-text search index (DESIGN §2.5).

`tokenizer` turns text into positioned tokens, `query` parses the `+`/`-`/phrase
syntax, `engine` matches, scores and highlights over any `PostingsReader`,
`memory` and `sqlite` are the two backends, and `registry` owns the named indexes.
"""

from aggregator.textindex.engine import AddOutcome, SearchHit, SearchOutcome, TextIndex
from aggregator.textindex.query_parser import ParsedQuery, parse_query
from aggregator.textindex.registry import BACKENDS, DEFAULT_INDEX, IndexRegistry, TextIndexError
from aggregator.textindex.tokenizer import TokenizerConfig, TokenizerConfigError, tokenize

__all__ = [
    "BACKENDS",
    "DEFAULT_INDEX",
    "AddOutcome",
    "IndexRegistry",
    "ParsedQuery",
    "SearchHit",
    "SearchOutcome",
    "TextIndex",
    "TextIndexError",
    "TokenizerConfig",
    "TokenizerConfigError",
    "parse_query",
    "tokenize",
]
