"""Tokenizer of the full-text index (DESIGN §2.5).

A token is a maximal run of `\\w` characters (Unicode letters, digits, underscore),
lower-cased when the index says so, and kept when its length (after lower-casing)
is at least `min_length`. Each token records its character span in the original
text, for highlights, and its *run position*: the ordinal of its run among all
runs of the text, dropped short runs included. Phrase matching compares run
positions, so `"state of the art"` (with `min_length` 3) needs `state`, then any
one run, then `the art`: the dropped `of` holds its place without being compared.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

WORD = re.compile(r"\w+")

DEFAULT_LOWERCASE = True
DEFAULT_MIN_LENGTH = 2
MAX_MIN_LENGTH = 1000


class TokenizerConfigError(ValueError):
    """A `tokenizer_config` that cannot be used; the message is shown to the caller."""


@dataclass(frozen=True, slots=True)
class TokenizerConfig:
    lowercase: bool = DEFAULT_LOWERCASE
    min_length: int = DEFAULT_MIN_LENGTH

    def to_dict(self) -> dict[str, Any]:
        return {"lowercase": self.lowercase, "min_length": self.min_length}

    @classmethod
    def from_dict(cls, raw: Any) -> TokenizerConfig:
        """Validate a caller's `tokenizer_config` object; missing fields take defaults."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise TokenizerConfigError("tokenizer_config must be an object")
        unknown = sorted(str(key) for key in raw if key not in ("lowercase", "min_length"))
        if unknown:
            raise TokenizerConfigError(
                f"Unknown tokenizer_config field: {unknown[0]} (known fields: lowercase, min_length)"
            )
        lowercase = raw.get("lowercase", DEFAULT_LOWERCASE)
        if not isinstance(lowercase, bool):
            raise TokenizerConfigError("tokenizer_config.lowercase must be a boolean")
        min_length = raw.get("min_length", DEFAULT_MIN_LENGTH)
        if isinstance(min_length, bool) or not isinstance(min_length, int):
            raise TokenizerConfigError("tokenizer_config.min_length must be an integer")
        if not 1 <= min_length <= MAX_MIN_LENGTH:
            raise TokenizerConfigError(f"tokenizer_config.min_length must be between 1 and {MAX_MIN_LENGTH}")
        return cls(lowercase=lowercase, min_length=min_length)


@dataclass(frozen=True, slots=True)
class Token:
    text: str  # the normalized token (lower-cased if the index says so)
    start: int  # character span in the original text
    end: int
    position: int  # ordinal of this \w run among all runs of the text


def iter_tokens(text: str, config: TokenizerConfig) -> Iterator[Token]:
    """The kept tokens of `text`, in order."""
    for position, match in enumerate(WORD.finditer(text)):
        word = match.group()
        if config.lowercase:
            word = word.lower()
        if len(word) >= config.min_length:
            yield Token(word, match.start(), match.end(), position)


def tokenize(text: str, config: TokenizerConfig) -> list[Token]:
    return list(iter_tokens(text, config))


def run_terms(text: str, config: TokenizerConfig) -> list[str | None]:
    """One entry per `\\w` run of `text`: its token, or None where `min_length` drops it."""
    words = WORD.findall(text)
    if config.lowercase:
        words = list(map(str.lower, words))
    min_length = config.min_length
    if min_length <= 1:
        return list(words)
    return [word if len(word) >= min_length else None for word in words]


def term_positions(text: str, config: TokenizerConfig) -> tuple[dict[str, list[int]], int]:
    """Postings of one document: term -> ascending run positions, and the token count."""
    postings: dict[str, list[int]] = {}
    count = 0
    for position, word in enumerate(run_terms(text, config)):
        if word is None:
            continue
        count += 1
        found = postings.get(word)
        if found is None:
            postings[word] = [position]
        else:
            found.append(position)
    return postings, count
