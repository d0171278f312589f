"""Give memory freed by a large one-off load back to the system.

glibc's malloc keeps freed heap memory in the process, and after a large buffer is freed it raises
its threshold for serving allocations from their own mappings, so a load that decompresses and
parses megabytes leaves them resident long after its temporaries are gone (the related-words
table's first load: +13.9 MB RSS, +6.4 after a trim). `malloc_trim(0)` returns the free pages. A
no-op off glibc (macOS, musl).
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

__all__ = ["release_freed_memory"]


@cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim, through `_ctypes` alone as the guard calls prctl (the `ctypes` package: 0.25 MB of RSS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        from aggregator.upstream.guard import libc_function  # the guard calls prctl the same way

        return libc_function("malloc_trim")
    except (OSError, AttributeError, ImportError):  # not glibc
        return None


def release_freed_memory() -> None:
    """Return the C heap's free pages to the system (about 0.1 ms), where the C library can."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
