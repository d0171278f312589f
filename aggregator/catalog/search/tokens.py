"""Tokenizer and light stemmer of the deterministic tool search (DESIGN §2.2).

Tokens are lower-cased runs of letters and digits. Text splits on whitespace,
punctuation, `_`, `-`, `.`, `/` and camelCase boundaries (`getUserProfile` →
get, user, profile; `HTTPServer` → http, server; `base64Encode` → base64,
encode; `URLs` → urls). Han and kana runs have no word boundaries, so they
become overlapping character bigrams (`搜索结果` → 搜索, 索结, 结果): Chinese and
Japanese descriptions are searchable at all, and a query written in them matches.

`identifiers` gives what the text writes as one identifier of several tokens
(`get_file`, `excel-write-to-sheet`, `getTimeEntries`) as a single token, its
tokens joined by `_` (`get_file`, `excel_write_to_sheet`, `get_time_entries`):
the search indexes each tool's name that way too, so a query that names a tool
finds it whole, as well as by its parts (the "preserve original" of word
delimiting tokenizers).

`stem` is the Snowball English stemmer (PyStemmer), so that "converts",
"converting" and "convert" meet. The search treats equal stems as an
exact match only; prefix and substring matching use the surface forms, so
stemming never widens the weaker tiers.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Sequence
from functools import lru_cache
from itertools import chain
from typing import Any

_ALNUM_RUN = re.compile(r"[^\W_]+")
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_SPLIT = re.compile(f"[{_CJK}]+|[^{_CJK}]+")
_CJK_CHAR = re.compile(f"[{_CJK}]")
# ASCII camelCase pieces: an acronym plural (URLs), an acronym before a capitalised
# word (HTTP|Server), a word with an optional leading capital, a bare acronym.
_CAMEL = re.compile(r"[A-Z0-9]+s(?![a-z])|[A-Z0-9]+(?=[A-Z][a-z])|[A-Z0-9]*[a-z0-9]+|[A-Z0-9]+")


def is_cjk(token: str) -> bool:
    """True for a token made of Han or kana characters (a bigram or a single character)."""
    return bool(token) and _CJK_CHAR.match(token) is not None


def _cjk_grams(chunk: str) -> list[str]:
    if len(chunk) == 1:
        return [chunk]
    return [chunk[i : i + 2] for i in range(len(chunk) - 1)]


@lru_cache(maxsize=65536)
def _split_run(run: str) -> tuple[str, ...]:
    """The tokens of one run of letters and digits (cached: words repeat across a catalog),
    interned: the index holds one string object per distinct term, however many tools use it."""
    return tuple(map(sys.intern, _split(run)))


def _split(run: str) -> list[str]:
    if run.isascii():
        return [piece.lower() for piece in _CAMEL.findall(run)]
    out: list[str] = []
    for chunk in _CJK_SPLIT.findall(run):
        if _CJK_CHAR.match(chunk):
            out.extend(_cjk_grams(chunk))
        elif chunk.isascii():
            out.extend(piece.lower() for piece in _CAMEL.findall(chunk))
        else:
            out.append(chunk.lower())
    return out


def tokenize(text: str | None) -> list[str]:
    """Every token of `text`, in order, repeats kept."""
    if not text:
        return []
    return list(chain.from_iterable(map(_split_run, _ALNUM_RUN.findall(text))))


_IDENTIFIER = re.compile(r"[^\W_]+(?:[_.-]+[^\W_]+)*")


def identifier(tokens: Sequence[str]) -> str | None:
    """Several tokens as one identifier token, joined by `_`; None for fewer than two."""
    return sys.intern("_".join(tokens)) if len(tokens) > 1 else None


def _written_identifiers(text: str | None) -> Iterator[tuple[re.Match[str], str]]:
    """Each word of `text` that makes an identifier of several tokens, as found, and that token."""
    for found in _IDENTIFIER.finditer(text or ""):
        if (token := identifier(tokenize(found.group()))) is not None:
            yield found, token


def identifiers(text: str | None) -> list[str]:
    """Every identifier of several tokens in `text`, in order, as one token joined by `_`."""
    return [token for _, token in _written_identifiers(text)]


_HOST_MARKS = ("@", "//")  # before an email address's domain, before a URL's host


def dotted_words(text: str | None) -> dict[str, str]:
    """The words of `text` written as a name, a dot and a last part ("notes.txt", "backup.tar.gz",
    "nytimes.com"), as their `identifiers` token → the last part, lower-cased: a file's extension
    or a host's top-level domain, when it is one (`query.Lexicon.dotted_word_words` says). The
    domain of an email address ("jenny@park.io") and the host of a URL written with its scheme
    ("https://example.com", whose "https" speaks for it) are not such words. A written identifier
    neither starts nor ends with a dot, so both parts are there whenever it holds one."""
    text = text or ""
    return {
        token: found.group().rpartition(".")[2].lower()
        for found, token in _written_identifiers(text)
        if "." in found.group() and not text.endswith(_HOST_MARKS, 0, found.start())
    }


def is_identifier(token: str) -> bool:
    """True for a token made by `identifiers` (several tokens joined)."""
    return "_" in token


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    """PyStemmer's English stemmer, loaded with the first word stemmed (the first search), not by
    `serve`: 0.7 MB of RSS a session that never searches does not pay (issue 24)."""
    import Stemmer

    return Stemmer.Stemmer("english")


@lru_cache(maxsize=65536)
def stem(token: str) -> str:
    """The Snowball (Porter 2) English stem of an ASCII word; other tokens come back unchanged."""
    if len(token) <= 3 or not token.isascii() or not token.isalpha():
        return token
    return str(_stemmer().stemWord(token))


_INFLECTIONS = ("ing", "ed", "es", "s", "d")


def _inflection_bases(word: str) -> set[str]:
    """What `word` may be an inflection of: itself, less -s/-es/-d/-ed/-ing, with an "e" back, a
    doubled consonant undone or "i" back to "y" ("staging" → stag, stage; "stopped" → stop;
    "entries" → entry)."""
    bases = {word}
    if word.endswith(("ies", "ied")) and len(word) > 4:
        bases.add(word[:-3] + "y")
    for ending in _INFLECTIONS:
        if word.endswith(ending) and len(word) - len(ending) >= 3:
            base = word[: -len(ending)]
            bases.update((base, base + "e"))
            if len(base) > 3 and base[-1] == base[-2]:
                bases.add(base[:-1])
    return bases


def inflection_pair(a: str, b: str) -> bool:
    """True when two words are forms of one word by an inflectional ending ("commit", "commits";
    "stage", "staged", "staging"; "entry", "entries"), not by a derivational suffix that the
    stemmer also strips and that often changes the sense ("commit"/"commitment",
    "design"/"designation", "effect"/"effective")."""
    return bool(_inflection_bases(a) & _inflection_bases(b))


_WORD = re.compile(r"[^\W_]+")
_SENTENCE_START = frozenset('.!?:;"(')


def names(text: str | None) -> frozenset[str]:
    """Tokens of the words `text` writes as names: capitalised ("Rey", not "REY" nor "rey") and not
    the first word of a sentence. None when every word is capitalised (a title, not a request)."""
    if not text:
        return frozenset()
    words = list(_WORD.finditer(text))
    capitalised = [m for m in words if m.group()[0].isupper() and m.group()[1:].islower()]
    if len(capitalised) == len(words):
        return frozenset()
    found: set[str] = set()
    for match in capitalised:
        before = text[: match.start()].rstrip()
        if before and before[-1] not in _SENTENCE_START:
            found.update(tokenize(match.group()))
    return frozenset(found)
