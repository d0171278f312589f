"""Byte caps on JSON results (DESIGN §2.1).

A list result shrinks to the largest prefix of its items whose whole JSON fits
`max_bytes`; a single item that cannot fit is `result_too_large`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from aggregator.faults import Fault

DEFAULT_MAX_RESULT_BYTES = 262_144


def json_size(payload: Any) -> int:
    """Bytes of the compact UTF-8 JSON the tools send."""
    return len(dumps(payload).encode("utf-8"))


def dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def capped_text(text: str, limit: int) -> str:
    """`text`, cut to at most `limit` characters with an ellipsis when it is longer."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def cap_list(
    items: Sequence[Any],
    build: Callable[[list[Any], bool], dict[str, Any]],
    max_bytes: int,
) -> dict[str, Any]:
    """The payload `build(prefix, truncated)` for the longest prefix of `items` that fits.

    `build` receives the kept items and whether any were cut. Binary search over the
    prefix length keeps this O(log n) serializations.
    """
    full = build(list(items), False)
    if json_size(full) <= max_bytes:
        return full
    lo, hi = 0, len(items) - 1  # lo fits (maybe 0 items), hi+1 does not
    if json_size(build([], True)) > max_bytes:
        raise Fault("result_too_large", f"even an empty result exceeds max_result_bytes={max_bytes}")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if json_size(build(list(items[:mid]), True)) <= max_bytes:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0 and items:
        raise Fault(
            "result_too_large",
            f"a single item exceeds max_result_bytes={max_bytes}; raise the limit or narrow the request",
        )
    return build(list(items[:lo]), True)
