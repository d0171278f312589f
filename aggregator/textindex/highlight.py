"""Highlights: up to three snippets of a document around its matches (DESIGN §2.5).

Matches are token-aligned: only whole tokens (as the index's tokenizer cuts them)
equal to a positive query token count (`api` never matches inside `rapid`); a
phrase match spans its first to its last token. Excluded terms are never
highlighted. Each snippet reaches ±30 characters around its match, trimmed so that
it does not cut a word, whitespace collapsed, with `...` where the document goes
on. Snippets are chosen so that distinct query parts (phrases first, then `+`
terms, then bare terms) each get one before any part gets a second one;
overlapping snippets merge; the result is in document order.

The work is bounded whatever the document and query (a 1 MiB note, a 900-byte phrase of the
same word): at most `MAX_SPANS` matches of each query part are kept (three snippets need far
fewer), phrase checks stop after `PHRASE_STEPS` token steps, and at most three windows are
ever added, so a dense document cannot merge them into one unbounded snippet.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from aggregator.textindex.query_parser import ParsedQuery, Phrase
from aggregator.textindex.tokenizer import WORD, TokenizerConfig, iter_tokens

MAX_HIGHLIGHTS = 3
RADIUS = 30
MAX_SPANS = 64  # matches kept per query part
PHRASE_STEPS = 50_000  # token steps spent checking phrase candidates in one document
_WORD_CHAR = re.compile(r"\w")

Span = tuple[int, int, int]  # start, end, rank of the query part it matches


def _is_word(text: str, index: int) -> bool:
    return 0 <= index < len(text) and _WORD_CHAR.match(text, index) is not None


def _term_ranks(query: ParsedQuery) -> dict[str, int]:
    """Rank of each highlightable term: after the phrases, `+` terms then bare ones, never excluded."""
    excluded = set(query.must_not)
    ranks: dict[str, int] = {}
    for term in (*query.must, *query.terms):
        if term not in excluded:
            ranks.setdefault(term, len(query.phrases) + len(ranks))
    return ranks


def _comparable(text: str, config: TokenizerConfig) -> str | None:
    """`text` as its tokens compare, offset for offset; None where lower-casing the whole text
    differs from lower-casing each token (U+0130 grows to two characters; Σ depends on context)."""
    if not config.lowercase:
        return text
    if "\u0130" in text or "\u03a3" in text:
        return None
    return text.lower()


def _found_by_search(text: str, comparable: str, word: str, limit: int) -> list[tuple[int, int]]:
    """Spans of the first `limit` whole-token occurrences of `word`, found with `str.find`."""
    found: list[tuple[int, int]] = []
    at = comparable.find(word)
    while at >= 0 and len(found) < limit:
        end = at + len(word)
        if not _is_word(text, at - 1) and not _is_word(text, end):
            found.append((at, end))
        at = comparable.find(word, at + 1)
    return found


def _found_by_tokens(text: str, config: TokenizerConfig, wanted: Mapping[str, int]) -> dict[str, list[tuple[int, int]]]:
    """Spans of the first `wanted[word]` tokens of `text` equal to each word, by tokenizing: exact for any text."""
    found: dict[str, list[tuple[int, int]]] = {word: [] for word in wanted}
    for token in iter_tokens(text, config):
        if token.text in found and len(found[token.text]) < wanted[token.text]:
            found[token.text].append((token.start, token.end))
    return found


def _phrase_end(text: str, config: TokenizerConfig, phrase: Phrase, end: int) -> int | None:
    """Where `phrase` ends if its first token ends at `end` and the following runs complete it."""
    expected = dict(zip(phrase.offsets[1:], phrase.tokens[1:], strict=True))
    runs = WORD.finditer(text, end)
    for offset in range(1, phrase.offsets[-1] + 1):
        match = next(runs, None)
        if match is None:
            return None
        if offset in expected:
            word = match.group().lower() if config.lowercase else match.group()
            if word != expected[offset]:
                return None
        end = match.end()
    return end


def spans(text: str, config: TokenizerConfig, query: ParsedQuery, *, search: bool = True) -> list[Span]:
    """Every match of a positive query part, in document order.

    With `search`, tokens are found with `str.find` where offsets allow (the fast way: a
    document is not tokenized); the result is the same as tokenizing (`search=False`).
    """
    ranks = _term_ranks(query)
    wanted = dict.fromkeys(ranks, MAX_SPANS)  # word → how many occurrences can be of use
    for phrase in query.phrases:
        attempts = PHRASE_STEPS // (phrase.offsets[-1] + 1) + 1
        wanted[phrase.tokens[0]] = max(wanted.get(phrase.tokens[0], 0), attempts)
    comparable = _comparable(text, config) if search else None
    if comparable is None:
        found = _found_by_tokens(text, config, wanted)
    else:
        found = {word: _found_by_search(text, comparable, word, limit) for word, limit in wanted.items()}
    result: list[Span] = [(lo, hi, rank) for term, rank in ranks.items() for lo, hi in found[term][:MAX_SPANS]]
    steps = 0
    for rank, phrase in enumerate(query.phrases):
        matched = 0
        for lo, hi in found[phrase.tokens[0]]:
            steps += phrase.offsets[-1] + 1
            if matched >= MAX_SPANS or steps > PHRASE_STEPS:
                break
            end = _phrase_end(text, config, phrase, hi)
            if end is not None:
                result.append((lo, end, rank))
                matched += 1
    result.sort()
    return result


def _window(text: str, start: int, end: int) -> tuple[int, int]:
    """[start - RADIUS, end + RADIUS] clipped to the text, shrunk so that no word is cut."""
    lo, hi = max(0, start - RADIUS), min(len(text), end + RADIUS)
    while lo < start and _is_word(text, lo - 1) and _is_word(text, lo):
        lo += 1
    while hi > end and _is_word(text, hi - 1) and _is_word(text, hi):
        hi -= 1
    return lo, hi


def _add_window(windows: list[tuple[int, int]], new: tuple[int, int]) -> list[tuple[int, int]]:
    """`windows` plus `new`, overlapping windows merged."""
    lo, hi = new
    kept = []
    for w_lo, w_hi in windows:
        if w_lo <= hi and lo <= w_hi:
            lo, hi = min(lo, w_lo), max(hi, w_hi)
        else:
            kept.append((w_lo, w_hi))
    kept.append((lo, hi))
    return sorted(kept)


def _choose(text: str, spans: list[Span]) -> list[tuple[int, int]]:
    windows: list[tuple[int, int]] = []

    def covered(span: Span) -> bool:
        return any(lo <= span[0] and span[1] <= hi for lo, hi in windows)

    first_of_rank: dict[int, Span] = {}
    for span in spans:
        first_of_rank.setdefault(span[2], span)
    ordered = [first_of_rank[rank] for rank in sorted(first_of_rank)] + spans
    added = 0
    for span in ordered:
        if added >= MAX_HIGHLIGHTS:  # not len(windows): merged windows would grow without bound
            break
        if not covered(span):
            windows = _add_window(windows, _window(text, span[0], span[1]))
            added += 1
    return windows


def _render(text: str, lo: int, hi: int) -> str:
    body = " ".join(text[lo:hi].split())
    return ("..." if lo > 0 else "") + body + ("..." if hi < len(text) else "")


def make_highlights(text: str, config: TokenizerConfig, query: ParsedQuery) -> list[str]:
    """At most three snippets of `text` around matches of `query`, in document order."""
    return [_render(text, lo, hi) for lo, hi in _choose(text, spans(text, config, query))]
