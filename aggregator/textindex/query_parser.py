"""Query parser of the full-text index (DESIGN §2.5).

Syntax, split on whitespace:
- `word`      optional term (at least one must match when there is no `+` term or phrase);
- `+word`     required term;
- `-word`     excluded term;
- `"a b c"`   required phrase: its tokens on consecutive runs of a document
              (an unterminated quote runs to the end of the query);
- `-"a b"`    excluded phrase (listed in `must_not` as the phrase text); `+"a b"` is a phrase.

Every word and phrase goes through the index's own tokenizer, so `rate-limiting`
is the two terms `rate` and `limiting`, and a sign applies to each of them. Words
that leave no token (too short, punctuation) vanish. Lists keep the order of first
appearance without duplicates; a term that is required is not repeated as optional.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aggregator.textindex.tokenizer import TokenizerConfig, tokenize


@dataclass(frozen=True, slots=True)
class Phrase:
    tokens: tuple[str, ...]
    offsets: tuple[int, ...]  # run position of each token relative to the first

    @property
    def text(self) -> str:
        return " ".join(self.tokens)


@dataclass(frozen=True, slots=True)
class ParsedQuery:
    terms: tuple[str, ...] = ()
    must: tuple[str, ...] = ()
    must_not: tuple[str, ...] = ()
    phrases: tuple[Phrase, ...] = ()
    excluded_phrases: tuple[Phrase, ...] = field(default=())

    @property
    def positive(self) -> tuple[str, ...]:
        """Distinct scoring tokens (bare, `+` and phrase tokens), sorted for a fixed summation order."""
        tokens = set(self.terms) | set(self.must)
        for phrase in self.phrases:
            tokens.update(phrase.tokens)
        return tuple(sorted(tokens))

    @property
    def is_empty(self) -> bool:
        return not (self.terms or self.must or self.must_not or self.phrases or self.excluded_phrases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "terms": list(self.terms),
            "must": list(self.must),
            "must_not": [*self.must_not, *(phrase.text for phrase in self.excluded_phrases)],
            "phrases": [phrase.text for phrase in self.phrases],
        }


class _Builder:
    """Accumulates parsed parts in order of first appearance."""

    def __init__(self) -> None:
        self.terms: dict[str, None] = {}
        self.must: dict[str, None] = {}
        self.must_not: dict[str, None] = {}
        self.phrases: dict[Phrase, None] = {}
        self.excluded_phrases: dict[Phrase, None] = {}

    def add_word(self, sign: str, tokens: list[str]) -> None:
        target = {"+": self.must, "-": self.must_not}.get(sign, self.terms)
        for token in tokens:
            target.setdefault(token, None)

    def add_phrase(self, sign: str, phrase: Phrase) -> None:
        if sign == "-" and len(phrase.tokens) == 1:
            self.must_not.setdefault(phrase.tokens[0], None)
        elif sign == "-":
            self.excluded_phrases.setdefault(phrase, None)
        else:
            self.phrases.setdefault(phrase, None)

    def build(self) -> ParsedQuery:
        return ParsedQuery(
            terms=tuple(term for term in self.terms if term not in self.must),
            must=tuple(self.must),
            must_not=tuple(self.must_not),
            phrases=tuple(self.phrases),
            excluded_phrases=tuple(self.excluded_phrases),
        )


def _phrase(text: str, config: TokenizerConfig) -> Phrase | None:
    tokens = tokenize(text, config)
    if not tokens:
        return None
    first = tokens[0].position
    return Phrase(tuple(t.text for t in tokens), tuple(t.position - first for t in tokens))


def parse_query(query: str, config: TokenizerConfig) -> ParsedQuery:
    """Parse `query` with the tokenizer of the index it runs against."""
    builder = _Builder()
    i, n = 0, len(query)
    while i < n:
        if query[i].isspace():
            i += 1
            continue
        sign = ""
        if query[i] in "+-" and i + 1 < n and query[i + 1] == '"':
            sign, i = query[i], i + 1
        if query[i] == '"':
            close = query.find('"', i + 1)
            end = n if close < 0 else close
            phrase = _phrase(query[i + 1 : end], config)
            if phrase is not None:
                builder.add_phrase(sign, phrase)
            i = end + 1
            continue
        start = i
        while i < n and not query[i].isspace() and query[i] != '"':
            i += 1
        word = query[start:i]
        if word[0] in "+-":
            sign, word = word[0], word[1:]
        builder.add_word(sign, [t.text for t in tokenize(word, config)])
    return builder.build()
