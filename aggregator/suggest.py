""" "Did you mean …?": the closest known word to a mistyped one (config keys, names, subcommands)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]


def closest(word: str, valid: Iterable[str], cutoff: float = 0.6, *, parts: bool = False) -> str | None:
    """The option equal to `word` ignoring case, else the closest one above `cutoff`, else None.

    `parts`: failing that, the first option (in sorted order) that contains `word` (3+ characters).
    """
    import difflib  # here: only a mistake asks, and `serve` need not hold it (issue 24, memory)

    options = list(valid)
    for option in options:
        if option.lower() == word.lower():
            return option
    matches = difflib.get_close_matches(word, options, n=1, cutoff=cutoff)
    if not matches and parts:  # a prefix or a part of a long name ("current" for "get_current_time")
        matches = sorted(option for option in options if len(word) >= 3 and word.lower() in option.lower())[:1]
    return matches[0] if matches else None


def did_you_mean(word: str, valid: Iterable[str], *, parts: bool = False) -> str:
    """` (did you mean 'x'?)` when a known word is close to `word`, else the empty string."""
    match = closest(word, valid, parts=parts)
    return f" (did you mean {match!r}?)" if match is not None else ""
