"""Strings from outside made safe where they enter: lone surrogates, and terminal control characters.

A lone UTF-16 surrogate (``"\\ud800"`` in JSON, e.g. an emoji cut in half) is a valid Python
string but cannot be encoded as UTF-8: one in a tool result would make the writer that sends it
on fail. `scrub` replaces each with U+FFFD where an upstream's message is read, so nothing
downstream ever meets one.

An upstream's name, description or result may also hold terminal escapes (a window title, a
screen clear, a clipboard write with ``ESC ] 52``). `printable` shows every control character
as a ``\\uXXXX`` escape (valid inside JSON strings too), and `EscapedStream` applies it to
everything the CLI prints.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["EscapedStream", "SurrogateEscapes", "escaped_output", "has_surrogates", "printable", "scrub"]

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 controls but tab and newline, DEL, C1 controls, bidirectional overrides and isolates.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def has_surrogates(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def scrub(value: Any) -> Any:
    """`value` with every surrogate in its strings (keys too) replaced; `value` itself when clean.

    Walks dicts and lists as JSON decoding makes them; iterative, so any nesting depth is fine.
    """
    if isinstance(value, str):
        return _SURROGATE.sub(REPLACEMENT, value) if has_surrogates(value) else value
    if not isinstance(value, dict | list) or not _any_surrogate(value):
        return value
    return _rebuild(value)


def _any_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if has_surrogates(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _rebuild(value: Any) -> Any:
    """A copy of `value` with its strings scrubbed (containers copied depth-first, iteratively)."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        item, parent, key = stack.pop()
        if isinstance(item, dict):
            copy: dict[Any, Any] = {}
            for k, v in item.items():
                clean_key = scrub(k) if isinstance(k, str) else k
                copy[clean_key] = None
                stack.append((v, copy, clean_key))
            parent[key] = copy
        elif isinstance(item, list):
            items: list[Any] = [None] * len(item)
            stack.extend((v, items, i) for i, v in enumerate(item))
            parent[key] = items
        else:
            parent[key] = _SURROGATE.sub(REPLACEMENT, item) if isinstance(item, str) else item
    return root[0]


# In JSON text: an escaped backslash (consumed whole, so parity is kept), a surrogate pair, or a
# lone surrogate escape. Scanning left to right, a match never starts inside an escaped backslash.
_JSON_ESCAPE = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}(?:\\u[dD][c-fC-F][0-9a-fA-F]{2})?|\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_HIGH = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")
_PAIR_LENGTH = 12  # \uD83D\uDE00


class SurrogateEscapes:
    """Replaces lone surrogate escapes (``\\ud800``) in streamed JSON bytes with ``\\ufffd``.

    For parsers that refuse them outright (the SDK's HTTP client): the message then parses and its
    request is answered. Chunks may split an escape anywhere; a pending tail is held back.
    """

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk
        keep = _unfinished_tail(data)
        self._pending = data[len(data) - keep :] if keep else b""
        return _replace_lone(data[: len(data) - keep])

    def flush(self) -> bytes:
        data, self._pending = self._pending, b""
        return _replace_lone(data)


def _unfinished_tail(data: bytes) -> int:
    """How many bytes at the end to hold back: a possibly unfinished escape, and a high surrogate
    escape just before it (the low half may be what is unfinished)."""
    start = data.rfind(b"\\", max(0, len(data) - _PAIR_LENGTH))
    if start < 0:
        return 0
    start = _run_start(data, start)
    if start >= 6 and _HIGH.fullmatch(data, start - 6, start):
        start = _run_start(data, start - 6)
    return len(data) - start


def _run_start(data: bytes, index: int) -> int:
    """The start of the run of backslashes `index` is in (holding back a whole run keeps parity)."""
    while index > 0 and data[index - 1 : index] == b"\\":
        index -= 1
    return index


def _replace_lone(data: bytes) -> bytes:
    if b"\\u" not in data:
        return data

    def fix(match: re.Match[bytes]) -> bytes:
        found = match.group()
        return b"\\ufffd" if found[:2] == b"\\u" and len(found) == 6 else found

    return _JSON_ESCAPE.sub(fix, data)


def printable(text: str) -> str:
    """`text` safe for a terminal: control characters as ``\\uXXXX``, lone surrogates replaced."""
    if has_surrogates(text):
        text = _SURROGATE.sub(REPLACEMENT, text)
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class EscapedStream:
    """A text stream writing `printable` text to `unescaped` (which stays reachable for a progress line)."""

    def __init__(self, unescaped: TextIO) -> None:
        self.unescaped = unescaped

    def write(self, text: str) -> int:
        self.unescaped.write(printable(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.unescaped, name)


@contextmanager
def escaped_output() -> Iterator[None]:
    """Within the block, everything written to stdout and stderr is `printable` (the CLI's commands)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapedStream(sys.stdout), EscapedStream(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
